//! A key's value of one type (seconds, a size, a count, a boolean, a
//! string): the file's when it wins, else the flag's; a problem at its place.

use std::time::Duration;

use super::{Cx, Table, Val};
use crate::config::error::{parse_seconds, parse_size};
use crate::config::keys::flag_name;

impl Cx<'_> {
    pub(super) fn seconds(&mut self, key: &str, app: Option<&Table>, flag: &str, allow_zero: bool) -> Option<Duration> {
        let Some(v) = self.pick(key, app) else {
            return match parse_seconds(flag_name(key), flag, allow_zero) {
                Ok(d) => Some(d),
                Err(e) => {
                    self.nowhere(e.to_string());
                    None
                }
            };
        };
        let shown = match v.get_ref() {
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::String(s) => s.clone(),
            _ => String::new(),
        };
        match parse_seconds(flag_name(key), &shown, allow_zero) {
            Ok(d) => Some(d),
            Err(_) => {
                let least = if allow_zero { "0 or more" } else { "above 0" };
                self.at(
                    v.span(),
                    format!("{key} = {}: not a number of seconds {least} (try {key} = 10 or {key} = 0.5)", v.get_ref()),
                );
                None
            }
        }
    }

    pub(super) fn size(&mut self, key: &str, v: &Val) -> Option<u64> {
        let parsed = match v.get_ref() {
            toml::Value::Integer(i) if *i >= 1 => Ok(*i as u64),
            toml::Value::String(s) => parse_size(flag_name(key), s).map_err(|_| ()),
            _ => Err(()),
        };
        match parsed {
            Ok(n) => Some(n),
            Err(()) => {
                self.at(
                    v.span(),
                    format!("{key} = {}: not a size (try {key} = \"10MB\", \"512KB\" or \"1GB\")", v.get_ref()),
                );
                None
            }
        }
    }

    pub(super) fn flag_size(&mut self, flag: &'static str, value: &str) -> Option<u64> {
        match parse_size(flag, value) {
            Ok(n) => Some(n),
            Err(e) => {
                self.nowhere(e.to_string());
                None
            }
        }
    }

    pub(super) fn count(&mut self, key: &str, app: Option<&Table>, flag: u64, min: u64, max: u64) -> Option<u64> {
        let Some(v) = self.pick(key, app) else { return Some(flag) };
        match v.get_ref() {
            toml::Value::Integer(i) if *i >= 0 && (*i as u64) >= min && (*i as u64) <= max => Some(*i as u64),
            other => {
                let range =
                    if max >= u32::MAX as u64 { format!("{min} or more") } else { format!("from {min} to {max}") };
                self.at(v.span(), format!("{key} = {other}: must be a whole number {range}"));
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, key: &str, app: Option<&Table>, flag: bool) -> Option<bool> {
        let Some(v) = self.pick(key, app) else { return Some(flag) };
        match v.get_ref() {
            toml::Value::Boolean(b) => Some(*b),
            other => {
                self.at(v.span(), format!("{key} = {other}: must be true or false"));
                None
            }
        }
    }

    pub(super) fn string(&mut self, key: &str, app: Option<&Table>, flag: &str) -> Option<String> {
        let Some(v) = self.pick(key, app) else { return Some(flag.to_string()) };
        match v.get_ref() {
            toml::Value::String(s) if !s.is_empty() => Some(s.clone()),
            other => {
                self.at(v.span(), format!("{key} = {other}: must be a non-empty string"));
                None
            }
        }
    }
}
