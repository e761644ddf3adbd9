//! `GET /__valve__/usage`: who used which app and for how long, as JSON
//! (default) or CSV (`?format=csv`), of one app (`?app=NAME`) and since a
//! time (`?since=`): the Shiny sessions that ended since then, and the
//! requests per app per user per hour.

use std::time::{SystemTime, UNIX_EPOCH};

use http::{Response, StatusCode};

use super::query::{bad, Query};
use crate::http::reply::{error, text, ReplyBody};
use crate::usage::{hourly_csv, parse_since, session_csv, Usage, CSV_HEADER, SINCE_FORMS};

/// Answers a usage request; `known(app)` says whether valve serves an app of that name.
pub fn answer(usage: &Usage, query: Option<&str>, known: impl Fn(&str) -> bool) -> Response<ReplyBody> {
    let q = Query::parse(query);
    if let Some(refused) = q.refuse_unknown(&["app", "since", "format"]) {
        return refused.answer();
    }
    let format = match q.choice("format", &["json", "csv"]) {
        Ok(f) => f,
        Err(refused) => return refused.answer(),
    };
    let app = q.get("app");
    if let Some(name) = app {
        if !known(name) && !usage.knows(name) {
            return error(
                StatusCode::NOT_FOUND,
                &format!("no app named {name:?} is served or has usage; /__valve__/apps lists the apps"),
            );
        }
    }
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let since = match q.get("since") {
        None => None,
        Some(v) => match parse_since(v, now_ms) {
            Some(ms) => Some(ms),
            None => return bad("since", v, SINCE_FORMS).answer(),
        },
    };
    let (sessions, requests) = usage.report(app, since);
    match format {
        "csv" => {
            let mut out = String::from(CSV_HEADER);
            out.extend(sessions.iter().map(session_csv));
            out.extend(requests.iter().map(hourly_csv));
            text(StatusCode::OK, "text/csv; charset=utf-8", out)
        }
        _ => {
            let body = serde_json::json!({
                "app": app,
                "since": since.map(crate::log::utc),
                "sessions": sessions.iter().map(|s| s.to_json()).collect::<Vec<_>>(),
                "requests": requests.iter().map(|h| h.to_json()).collect::<Vec<_>>(),
            });
            text(StatusCode::OK, "application/json", body.to_string())
        }
    }
}
