//! What the usage list holds, as data and as text: a Shiny session that
//! ended, and the requests of one user to one app in one hour; each as a
//! JSON object (the API and the usage log's lines) and a CSV row, and read
//! back from a usage log line. Also the times `since=` takes.

use crate::log::{days_from_civil, utc};
use crate::worker::WorkerId;

const HOUR_MS: u64 = 3_600_000;

/// One Shiny session, from its WebSocket's opening to its end.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub app: String,
    /// The signed-in user (or its keyed hash with `usage_anonymize`); none: nobody signed in.
    pub user: Option<String>,
    pub start_ms: u64,
    pub end_ms: u64,
    pub worker: WorkerId,
    /// How often its browser came back to it after its connection dropped.
    pub reconnects: u32,
}

/// The requests of one user (or of nobody signed in) to one app in one hour.
#[derive(Clone, Debug, PartialEq)]
pub struct Hourly {
    pub app: String,
    pub user: Option<String>,
    /// Hours since 1970-01-01 (UTC).
    pub hour: u64,
    pub requests: u64,
}

impl Session {
    pub fn seconds(&self) -> f64 {
        self.end_ms.saturating_sub(self.start_ms) as f64 / 1000.0
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "session",
            "app": self.app,
            "user": self.user,
            "start": utc(self.start_ms),
            "end": utc(self.end_ms),
            "seconds": self.seconds(),
            "worker": self.worker,
            "reconnects": self.reconnects,
        })
    }
}

impl Hourly {
    pub fn start_ms(&self) -> u64 {
        self.hour * HOUR_MS
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "requests",
            "app": self.app,
            "user": self.user,
            "hour": utc(self.start_ms()),
            "requests": self.requests,
        })
    }
}

/// The columns of `?format=csv`: sessions and hourly request counts in one table.
pub const CSV_HEADER: &str = "type,app,user,start,end,seconds,worker,reconnects,requests\n";

/// A session's CSV row.
pub fn session_csv(s: &Session) -> String {
    let user = s.user.as_deref().map(csv_field).unwrap_or_default();
    format!(
        "session,{},{user},{},{},{},{},{},\n",
        csv_field(&s.app),
        utc(s.start_ms),
        utc(s.end_ms),
        s.seconds(),
        s.worker,
        s.reconnects
    )
}

/// An hour's CSV row: its start and end, and the requests.
pub fn hourly_csv(h: &Hourly) -> String {
    let user = h.user.as_deref().map(csv_field).unwrap_or_default();
    let (start, end) = (utc(h.start_ms()), utc(h.start_ms() + HOUR_MS));
    format!("requests,{},{user},{start},{end},,,,{}\n", csv_field(&h.app), h.requests)
}

/// A CSV field, quoted when it must be (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// What one line of a usage log holds.
#[derive(Debug, PartialEq)]
pub enum Record {
    Session(Session),
    Hourly(Hourly),
}

/// Reads one line of a usage log (as `to_json` wrote it); None if it is not one.
pub fn parse_line(line: &str) -> Option<Record> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let app = v["app"].as_str()?.to_string();
    let user = match &v["user"] {
        serde_json::Value::Null => None,
        u => Some(u.as_str()?.to_string()),
    };
    match v["type"].as_str()? {
        "session" => Some(Record::Session(Session {
            app,
            user,
            start_ms: parse_time(v["start"].as_str()?)?,
            end_ms: parse_time(v["end"].as_str()?)?,
            worker: v["worker"].as_u64()?,
            reconnects: u32::try_from(v["reconnects"].as_u64()?).ok()?,
        })),
        "requests" => Some(Record::Hourly(Hourly {
            app,
            user,
            hour: parse_time(v["hour"].as_str()?)? / HOUR_MS,
            requests: v["requests"].as_u64()?,
        })),
        _ => None,
    }
}

/// An RFC 3339 time (`2025-05-01T10:00:00Z`, with a fraction or an offset
/// such as `+02:00`) or a date (`2025-05-01`, midnight UTC), as Unix milliseconds.
pub fn parse_time(s: &str) -> Option<u64> {
    let s = s.trim();
    let num = |a: usize, b: usize| -> Option<u32> {
        let part = s.get(a..b)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok()).flatten()
    };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    if s.get(4..5) != Some("-") || s.get(7..8) != Some("-") || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let day_ms = days_from_civil(i64::from(y), m, d) * 86_400_000;
    if s.len() == 10 {
        return u64::try_from(day_ms).ok();
    }
    if !matches!(s.get(10..11), Some("T" | "t" | " ")) || s.get(13..14) != Some(":") || s.get(16..17) != Some(":") {
        return None;
    }
    let (hh, mm, ss) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    let mut ms = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &frac[..digits.min(3)]);
        ms = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_ms: i64 = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.get(..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let (oh, om) = (rest.get(1..3)?.parse::<i64>().ok()?, rest.get(4..6)?.parse::<i64>().ok()?);
            if rest.len() != 6 || rest.get(3..4) != Some(":") || oh > 23 || om > 59 {
                return None;
            }
            sign * (oh * 3_600_000 + om * 60_000)
        }
    };
    let t =
        day_ms + i64::from(hh) * 3_600_000 + i64::from(mm) * 60_000 + i64::from(ss) * 1000 + i64::from(ms) - offset_ms;
    u64::try_from(t).ok()
}

/// What `since=` takes, as Unix milliseconds: Unix seconds (`1714557600`),
/// an RFC 3339 time or a date (see `parse_time`), or a span back from
/// `now_ms` (`90s`, `30m`, `24h`, `7d`).
pub fn parse_since(value: &str, now_ms: u64) -> Option<u64> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        return (0.0..1e11).contains(&secs).then_some((secs * 1000.0) as u64);
    }
    let unit = match v.chars().last()? {
        's' => Some(1_000),
        'm' => Some(60_000),
        'h' => Some(HOUR_MS),
        'd' => Some(86_400_000),
        _ => None,
    };
    if let Some(unit) = unit {
        if let Ok(n) = v[..v.len() - 1].parse::<u64>() {
            return Some(now_ms.saturating_sub(n.saturating_mul(unit)));
        }
    }
    parse_time(v)
}

/// What to send instead of a bad `since=`.
pub const SINCE_FORMS: &str =
    "Unix seconds (1714557600), an RFC 3339 time (2024-05-01T10:00:00Z), a date (2024-05-01) or a span back from now (90s, 30m, 24h, 7d)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_since_read_every_documented_form_and_refuse_the_rest() {
        assert_eq!(parse_time("2024-05-01T10:00:00Z"), Some(1_714_557_600_000));
        assert_eq!(parse_time("2024-05-01T12:00:00.5+02:00"), Some(1_714_557_600_500));
        assert_eq!(parse_time("2024-05-01"), Some(1_714_521_600_000));
        assert_eq!(parse_time(&utc(1_714_557_600_123)), Some(1_714_557_600_123), "what utc() writes reads back");
        for bad in ["", "yesterday", "2024-13-01", "2024-05-01T25:00:00Z", "2024-05-01T10:00:00", "2024-5-1"] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
        let now = 1_714_557_600_000;
        assert_eq!(parse_since("1714557600", now), Some(now));
        assert_eq!(parse_since("24h", now), Some(now - 86_400_000));
        assert_eq!(parse_since("30m", now), Some(now - 1_800_000));
        assert_eq!(parse_since("7d", now), Some(now - 7 * 86_400_000));
        assert_eq!(parse_since("2024-05-01T10:00:00Z", now), Some(now));
        for bad in ["-5", "soon", "5y", "h", "NaN"] {
            assert_eq!(parse_since(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn records_round_trip_through_a_usage_log_line_and_quote_their_csv() {
        let s = Session {
            app: "shiny".into(),
            user: Some("o'brien, \"dan\"".into()),
            start_ms: 1_714_557_600_000,
            end_ms: 1_714_557_612_345,
            worker: 7,
            reconnects: 2,
        };
        assert_eq!(parse_line(&s.to_json().to_string()), Some(Record::Session(s.clone())));
        assert_eq!(s.to_json()["seconds"], 12.345);
        assert_eq!(
            session_csv(&s),
            "session,shiny,\"o'brien, \"\"dan\"\"\",2024-05-01T10:00:00.000Z,2024-05-01T10:00:12.345Z,12.345,7,2,\n"
        );
        let h = Hourly { app: "api".into(), user: None, hour: 476_266, requests: 12 };
        assert_eq!(parse_line(&h.to_json().to_string()), Some(Record::Hourly(h.clone())));
        assert_eq!(hourly_csv(&h), "requests,api,,2024-05-01T10:00:00.000Z,2024-05-01T11:00:00.000Z,,,,12\n");
        assert_eq!(parse_line("{\"type\":\"session\"}"), None);
        assert_eq!(parse_line("not json"), None);
    }
}
