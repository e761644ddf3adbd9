//! A config file's publishing: the `publish_*` keys at the top level (a flag
//! given explicitly wins), and the published apps, each resolved as an
//! `[[app]]` table of its own would be (the top level's defaults apply).

use std::path::{Path, PathBuf};

use toml::Spanned;

use super::{Cx, Table};
use crate::config::model::AppConfig;
use crate::config::publish::{self, Publishing};

impl Cx<'_> {
    /// `publish_dir` and its companions; `Some(None)` when publishing is off.
    pub(super) fn publishing(&mut self) -> Option<Option<Publishing>> {
        let a = self.args;
        let base = self.base();
        let path = |cx: &mut Self, key: &str, flag: &Option<PathBuf>| -> Option<Option<PathBuf>> {
            match cx.pick(key, None) {
                Some(v) => match v.get_ref().as_str() {
                    Some(s) if !s.is_empty() => Some(Some(base.join(s))),
                    _ => {
                        cx.at(v.span(), format!("{key} = {}: must be a path (a string)", v.get_ref()));
                        None
                    }
                },
                None => Some(flag.clone()),
            }
        };
        let dir = path(self, "publish_dir", &a.publish_dir)?;
        let keys_file = path(self, "publish_keys_file", &a.publish_keys_file)?;
        let addr = match self.pick("publish_addr", None) {
            Some(_) => Some(self.string("publish_addr", None, "")?),
            None => a.publish_addr.clone(),
        };
        let keep = self.count("publish_keep", None, a.publish_keep as u64, 1, 10_000)? as usize;
        let versions = self.string("publish_versions", None, &a.publish_versions)?;
        let max_size = match self.pick("publish_max_size", None) {
            Some(v) => self.size("publish_max_size", v)?,
            None => self.flag_size("--publish-max-size", &a.publish_max_size)?,
        };
        let max_files = self.count("publish_max_files", None, a.publish_max_files, 1, u32::MAX as u64)?;
        let Some(dir) = dir else { return Some(None) };
        let Some(keys_file) = keys_file else {
            self.nowhere("publish_dir needs publish_keys_file: a file of keys that may publish (`valve publish-key NAME` makes one)".into());
            return None;
        };
        match crate::config::flags::publishing(&dir, &keys_file, addr, keep, &versions, max_size, max_files) {
            Ok(p) => Some(p),
            Err(e) => {
                self.nowhere(e.to_string());
                None
            }
        }
    }

    /// Adds the published apps to `apps`, each as its own `[[app]]` table
    /// (name, path, file and its allow lists) would be.
    pub(super) fn published(&mut self, p: &Publishing, apps: &mut Vec<AppConfig>, base: &Path) {
        let found = match publish::published(p, self.candidate) {
            Ok(found) => found,
            Err(e) => return self.nowhere(e.to_string()),
        };
        let configured = apps.len();
        for one in found {
            if let Some(with) = publish::clash(&one.name, &apps[..configured]) {
                let message = publish::clash_error(p, &one.name, with).to_string();
                self.nowhere(message);
                continue;
            }
            let value = |v: toml::Value| Spanned::new(0..0, v);
            let mut table = Table::new();
            table.insert("name".into(), value(one.name.clone().into()));
            table.insert("path".into(), value(format!("/{}", one.name).into()));
            table.insert("file".into(), value(one.source.path().display().to_string().into()));
            for (key, names) in [("allow_users", &one.allow.users), ("allow_groups", &one.allow.groups)] {
                if let Some(names) = names {
                    let list = names.iter().map(|n| toml::Value::String(n.clone())).collect();
                    table.insert(key.into(), value(toml::Value::Array(list)));
                }
            }
            if let Some(mut app) = self.app(apps.len(), &Spanned::new(0..0, table), base, 2) {
                app.instance = Some(one.guid.clone());
                apps.push(app);
            }
        }
    }

    /// The folder relative paths in the file start from.
    fn base(&self) -> PathBuf {
        self.base.clone()
    }
}
