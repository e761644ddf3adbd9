//! The query string of an admin page: its parameters, decoded, and the 400
//! a bad one gets (a short JSON body naming the parameter, its value and
//! what to send instead).

use http::{Response, StatusCode};

use crate::http::reply::{error, ReplyBody};

/// A query string's parameters, in order.
pub struct Query(Vec<(String, String)>);

impl Query {
    /// `a=1&b=two%20words`; a parameter without `=` has the value "".
    pub fn parse(query: Option<&str>) -> Query {
        let pairs = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (decode(k), decode(v))
            })
            .collect();
        Query(pairs)
    }

    /// The last value given for `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The first parameter not in `known`, if any.
    pub fn refuse_unknown(&self, known: &[&str]) -> Option<Bad> {
        let (name, _) = self.0.iter().find(|(k, _)| !known.contains(&k.as_str()))?;
        Some(Bad(format!("unknown parameter {name:?}: this page takes {}", known.join(", "))))
    }

    /// `follow=1`: true for `1`, `true`, `yes` (or no value), false for `0`,
    /// `false`, `no`, a 400 otherwise.
    pub fn flag(&self, name: &str) -> Result<bool, Bad> {
        match self.get(name) {
            None => Ok(false),
            Some("" | "1" | "true" | "yes") => Ok(true),
            Some("0" | "false" | "no") => Ok(false),
            Some(other) => Err(bad(name, other, "1 or 0")),
        }
    }

    /// `format=`: one of `allowed` (the first by default), a 400 otherwise.
    pub fn choice(&self, name: &str, allowed: &[&'static str]) -> Result<&'static str, Bad> {
        match self.get(name) {
            None => Ok(allowed[0]),
            Some(v) => allowed.iter().find(|a| **a == v).copied().ok_or_else(|| bad(name, v, &allowed.join(" or "))),
        }
    }
}

/// A parameter this page does not take, or a value it cannot use: a 400.
#[derive(Debug)]
pub struct Bad(String);

impl Bad {
    /// The 400, with its message in a short JSON body.
    pub fn answer(&self) -> Response<ReplyBody> {
        error(StatusCode::BAD_REQUEST, &self.0)
    }
}

/// `name=value` is not what this page takes; `want` says what is.
pub fn bad(name: &str, value: &str, want: &str) -> Bad {
    Bad(format!("{name}={value:?} is not valid: send {want}"))
}

/// Percent-decoding (and `+` as a space), as forms encode a query.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded_and_bad_ones_named() {
        let q = Query::parse(Some("app=sales%20team&since=2024-05-01T10%3A00%3A00Z&follow&x=%zz+y"));
        assert_eq!(q.get("app"), Some("sales team"));
        assert_eq!(q.get("since"), Some("2024-05-01T10:00:00Z"));
        assert_eq!(q.flag("follow").ok(), Some(true));
        assert_eq!(q.get("x"), Some("%zz y"));
        assert!(q.refuse_unknown(&["app", "since", "follow", "x"]).is_none());
        assert_eq!(q.refuse_unknown(&["app"]).map(|b| b.answer().status()), Some(StatusCode::BAD_REQUEST));
        let q = Query::parse(Some("format=xml&follow=maybe"));
        assert!(q
            .choice("format", &["text", "json"])
            .unwrap_err()
            .0
            .contains("format=\"xml\" is not valid: send text or json"));
        assert!(q.flag("follow").is_err());
        assert_eq!(Query::parse(None).choice("format", &["json", "csv"]).ok(), Some("json"));
    }
}
