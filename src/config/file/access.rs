//! A config file's access settings: `trusted_proxies`, the identity header
//! names, `sign_in_url`, `auth_url` and `auth_cache` at the top level (a flag given explicitly wins),
//! and `allow_users`/`allow_groups` per app, the top level's as defaults (an
//! app that sets either list has its own pair, and the defaults do not apply).

use super::{Cx, Table, Val};
use crate::config::access::{self, Allow, Cidr, Trust};

impl Cx<'_> {
    pub(super) fn trust(&mut self) -> Option<Trust> {
        let proxies = self.proxies();
        let a = self.args;
        let user_header = self.header("user_header", &a.user_header);
        let email_header = self.header("email_header", &a.email_header);
        let groups_header = self.header("groups_header", &a.groups_header);
        let sign_in_url = match self.pick("sign_in_url", None) {
            Some(v) => match v.get_ref().as_str().map(access::sign_in_url) {
                Some(Ok(url)) => Some(Some(url)),
                Some(Err(why)) => self.refuse(v, format!("sign_in_url = {}: {why}", v.get_ref())),
                None => self.refuse(v, "sign_in_url must be a string such as \"/oauth2/start?rd={rd}\"".into()),
            },
            None => match a.sign_in_url.as_deref().map(access::sign_in_url).transpose() {
                Ok(url) => Some(url),
                Err(why) => {
                    self.nowhere(format!("--sign-in-url: {why}"));
                    None
                }
            },
        };
        let auth = self.auth();
        Some(Trust {
            auth: auth?,
            proxies: proxies?,
            user_header: user_header?,
            email_header: email_header?,
            groups_header: groups_header?,
            sign_in_url: sign_in_url?,
        })
    }

    /// `auth_url = "http://127.0.0.1:4180/oauth2/auth"` and `auth_cache` (seconds).
    fn auth(&mut self) -> Option<Option<access::AuthService>> {
        let cache = self.seconds("auth_cache", None, &self.args.auth_cache.clone(), true);
        let (url, at) = match self.pick("auth_url", None) {
            Some(v) => match v.get_ref().as_str() {
                Some(url) => (url.to_string(), Some(v)),
                None => return self.refuse(v, format!("auth_url = {}: must be a string", v.get_ref())),
            },
            None => match &self.args.auth_url {
                Some(url) => (url.clone(), None),
                None => return cache.map(|_| None),
            },
        };
        match access::auth_service(&url, cache?) {
            Ok(service) => Some(Some(service)),
            Err(why) => match at {
                Some(v) => self.refuse(v, format!("auth_url: {why}")),
                None => {
                    self.nowhere(format!("--auth-url: {why}"));
                    None
                }
            },
        }
    }

    /// `trusted_proxies = ["10.0.0.0/8", "192.168.1.5"]` (or one string, comma-separated).
    fn proxies(&mut self) -> Option<Vec<Cidr>> {
        let Some(v) = self.pick("trusted_proxies", None) else {
            return match access::parse_cidrs(&self.args.trusted_proxies) {
                Ok(list) => Some(list),
                Err(why) => {
                    self.nowhere(format!("--trusted-proxies: {why}"));
                    None
                }
            };
        };
        let parsed = match v.get_ref() {
            toml::Value::String(s) => access::parse_cidrs(s),
            toml::Value::Array(items) => items
                .iter()
                .map(|i| i.as_str().ok_or_else(|| format!("{i} is not a string")).and_then(Cidr::parse))
                .collect(),
            other => Err(format!("{other} is not a list")),
        };
        parsed
            .map_err(|why| {
                self.at(
                    v.span(),
                    format!("trusted_proxies: {why} (write trusted_proxies = [\"127.0.0.1/32\", \"10.0.0.0/8\"])"),
                )
            })
            .ok()
    }

    fn header(&mut self, key: &str, flag: &str) -> Option<String> {
        let value = self.string(key, None, flag)?;
        match access::header_name(&value) {
            Ok(name) => Some(name),
            Err(why) => match self.pick(key, None) {
                Some(v) => self.refuse(v, format!("{key}: {why}")),
                None => {
                    self.nowhere(format!("--{}: {why}", key.replace('_', "-")));
                    None
                }
            },
        }
    }

    /// `admin_token_file`, `admin_users` and `admin_groups` (lists of names).
    pub(super) fn admin_access(&mut self, base: &std::path::Path) -> Option<crate::config::model::AdminAccess> {
        let a = self.args;
        let token_file = match self.pick("admin_token_file", None) {
            Some(v) => match v.get_ref().as_str() {
                Some(s) if !s.is_empty() => Some(base.join(s)),
                _ => return self.refuse(v, format!("admin_token_file = {}: must be a path (a string)", v.get_ref())),
            },
            None => a.admin_token_file.clone(),
        };
        let list = |cx: &mut Self, key: &str, flag: &str| -> Option<Vec<String>> {
            match cx.pick(key, None) {
                Some(v) => cx.names(Some(v)).map(Option::unwrap_or_default),
                None => Some(crate::config::flags::split_list(flag)),
            }
        };
        let users = list(self, "admin_users", &a.admin_users.clone());
        let groups = list(self, "admin_groups", &a.admin_groups.clone());
        Some(crate::config::model::AdminAccess { token_file, users: users?, groups: groups? })
    }

    fn refuse<T>(&mut self, v: &Val, message: String) -> Option<T> {
        self.at(v.span(), message);
        None
    }

    /// An app's allow lists: its own pair if it sets either, else the top level's.
    pub(super) fn allow(&mut self, app: &Table) -> Option<Allow> {
        let own = app.contains_key("allow_users") || app.contains_key("allow_groups");
        let table = if own { app } else { self.top };
        let users = self.names(table.get("allow_users"))?;
        let groups = self.names(table.get("allow_groups"))?;
        Some(Allow { users, groups })
    }

    fn names(&mut self, v: Option<&Val>) -> Option<Option<Vec<String>>> {
        let Some(v) = v else { return Some(None) };
        let list = v.get_ref().as_array().and_then(|items| {
            items.iter().map(|i| i.as_str().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)).collect()
        });
        match list {
            Some(names) => Some(Some(names)),
            None => self.refuse(
                v,
                format!("{} must be a list of names, such as [\"alice\", \"bob@example.org\"]", v.get_ref()),
            ),
        }
    }
}
