//! The manual's metrics page (docs/src/reference/metrics.md): what
//! `/__valve__/metrics` serves, the registry's families and the published
//! apps' beside them, each with its type, labels and help
//! (`metrics::reference` renders the page).

use std::collections::BTreeMap;

use crate::admin::publish::{published_metrics, Summary};
use crate::metrics::reference::{exercised_text, metrics_page};

#[test]
fn the_reference_page_of_metrics_is_what_valve_serves() {
    let mut text = exercised_text();
    let summary = BTreeMap::from([(
        "app".to_string(),
        Summary {
            owner: None,
            version: Some(2),
            versions: vec![1, 2],
            activated: Some(1),
            activated_by: Some("alice".into()),
        },
    )]);
    let deployments = BTreeMap::from([(("app".to_string(), true), 1), (("app".to_string(), false), 1)]);
    text.push_str(&published_metrics(&summary, &deployments));
    let page = metrics_page(&text);
    for needle in [
        "### `valve_saturation`\n\ngauge, labels `app`",
        "`reason` (`",
        "### `valve_publish_deployments_total`",
        "`process_open_fds`",
    ] {
        assert!(page.contains(needle), "{needle} in:\n{page}");
    }
    if let Err(e) = crate::config::reference::compare_or_bless("docs/src/reference/metrics.md", &page) {
        panic!("{e}");
    }
}
