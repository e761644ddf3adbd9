//! The uid each app without `run_as` gets, decided as data: a table of the
//! names given one so far (read from and written to the state folder by
//! `uid_store`), and for a name not in it, the first free uid in
//! `uid_range` from a keyed hash of the name. A uid once given never moves:
//! a new name never takes one the table holds, whatever its hash, and a
//! name keeps its uid when its app is removed (its files keep their owner),
//! so the same app added back gets its files back.

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::users;

/// Each name given a uid so far, and its uid.
pub type Table = BTreeMap<String, u32>;

/// What `give` decided for the names asked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Given {
    /// Every name asked that has a uid, and the uid.
    pub uids: BTreeMap<String, u32>,
    /// The names given a uid now (added to the table), in the order given.
    pub new: Vec<(String, u32)>,
    /// Names whose uid in the table is outside `range` (kept: moving it would
    /// orphan the app's files).
    pub outside: Vec<(String, u32)>,
    /// Names that cannot get a uid: every uid of the range is taken.
    pub refused: Vec<String>,
}

/// The table a first run starts with, so that upgrading moves nobody's
/// files: each of `own` (the apps that get a user of their own) at the uid
/// valve gave it before it kept a table (a hash of its name, collisions told
/// apart in the order of all of `names`).
pub fn seed(names: &[&str], own: &[&str], range: (u32, u32)) -> Table {
    let legacy = users::own_uids(names, range);
    names.iter().zip(legacy).filter(|(n, _)| own.contains(n)).map(|(n, uid)| (n.to_string(), uid)).collect()
}

/// Gives each of `names` its uid: the table's, else the first uid of
/// `range`, from the keyed hash of the name on, that no name in the table
/// holds and `taken` (a user of the machine, an app's `run_as`) does not.
/// New names are added to `table` in the order of their names.
pub fn give(
    table: &mut Table,
    names: &[&str],
    range: (u32, u32),
    key: &[u8; 32],
    taken: &dyn Fn(u32) -> bool,
) -> Given {
    let mut given = Given::default();
    let size = u64::from(range.1 - range.0) + 1;
    let inside = |uid: u32| (range.0..=range.1).contains(&uid);
    let asked: BTreeSet<&str> = names.iter().copied().collect();
    for name in &asked {
        if let Some(uid) = table.get(*name) {
            given.uids.insert(name.to_string(), *uid);
            if !inside(*uid) {
                given.outside.push((name.to_string(), *uid));
            }
        }
    }
    let mut held: BTreeSet<u32> = table.values().copied().filter(|u| inside(*u)).collect();
    let new: Vec<&str> = asked.into_iter().filter(|n| !table.contains_key(*n)).collect();
    for name in new {
        let start = slot(key, name) % size;
        let free = (0..size)
            .take_while(|_| (held.len() as u64) < size)
            .map(|i| range.0 + ((start + i) % size) as u32)
            .find(|uid| !held.contains(uid) && !taken(*uid));
        match free {
            Some(uid) => {
                held.insert(uid);
                table.insert(name.to_string(), uid);
                given.uids.insert(name.to_string(), uid);
                given.new.push((name.to_string(), uid));
            }
            None => given.refused.push(name.to_string()),
        }
    }
    given
}

/// Where a name starts looking: its keyed hash (HMAC-SHA-256), so that no
/// one without the key can pick a name that lands where they want.
fn slot(key: &[u8; 32], name: &str) -> u64 {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(b"valve app uid\0");
    mac.update(name.as_bytes());
    let tag = mac.finalize().into_bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&tag[..8]);
    u64::from_be_bytes(first)
}

/// The table as its file holds it: a comment, then `NAME UID` a line.
pub fn render(table: &Table) -> String {
    let mut out = String::from(
        "# valve: the uid of each app without run_as, given once and never moved.\n\
         # Written by valve; to pick an app's user yourself, set run_as in its config.\n",
    );
    for (name, uid) in table {
        out.push_str(&format!("{name} {uid}\n"));
    }
    out
}

/// Reads a table's text; an error reads `LINE: why`.
pub fn parse(text: &str) -> Result<Table, String> {
    let mut table = Table::new();
    let mut uids = BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(name), Some(uid), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("{n}: expected `NAME UID`, not {line:?}"));
        };
        let uid: u32 = uid
            .parse()
            .ok()
            .filter(|u| *u >= 1000 && *u != u32::MAX)
            .ok_or_else(|| format!("{n}: {uid:?} is not a uid valve gives (a number from 1000 up)"))?;
        if table.insert(name.to_string(), uid).is_some() {
            return Err(format!("{n}: the app {name:?} is listed twice"));
        }
        if !uids.insert(uid) {
            return Err(format!("{n}: uid {uid} is given to two apps"));
        }
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: (u32, u32) = (5000, 5999);

    fn nobody(_: u32) -> bool {
        false
    }

    /// Two names whose legacy uids collide in `RANGE`.
    fn legacy_pair() -> (String, String) {
        let mut seen = BTreeMap::new();
        for i in 0.. {
            let name = format!("app{i}");
            let uid = users::own_uids(&[&name], RANGE)[0];
            if let Some(other) = seen.insert(uid, name.clone()) {
                let (a, b) = if other < name { (other, name) } else { (name, other) };
                return (a, b);
            }
        }
        unreachable!()
    }

    #[test]
    fn a_name_added_later_never_takes_the_uid_of_one_given_before_in_either_order() {
        let (a, b) = legacy_pair();
        let key = [7u8; 32];
        for (first, later) in [(&a, &b), (&b, &a)] {
            // The first run seeds the table with the legacy uid: upgrading moves nobody.
            let mut table = seed(&[first.as_str()], &[first.as_str()], RANGE);
            let legacy = users::own_uids(&[first.as_str()], RANGE)[0];
            assert_eq!(table.get(first.as_str()), Some(&legacy));
            let both = [a.as_str(), b.as_str()];
            let given = give(&mut table, &both, RANGE, &key, &nobody);
            assert_eq!(given.uids[first.as_str()], legacy, "{first} keeps its uid when {later} comes");
            assert_ne!(given.uids[later.as_str()], legacy);
            assert_eq!(given.new, vec![(later.to_string(), given.uids[later.as_str()])]);
            // Read back from its text: the same uids, nothing new.
            let mut again = parse(&render(&table)).unwrap();
            assert_eq!(again, table);
            let next = give(&mut again, &both, RANGE, &[9u8; 32], &nobody);
            assert_eq!(next.uids, given.uids, "a table's uids hold whatever the key");
            assert!(next.new.is_empty());
            // A removed app keeps its uid reserved: nothing else takes it.
            let third = give(&mut again, &[later.as_str()], RANGE, &key, &nobody);
            assert_eq!(third.uids[later.as_str()], given.uids[later.as_str()]);
        }
        // Legacy seeding tells a collision apart as valve did: the name first in order keeps the slot.
        let seeded = seed(&[b.as_str(), a.as_str()], &[a.as_str(), b.as_str()], RANGE);
        assert_eq!(seeded[a.as_str()] + 1, seeded[b.as_str()]);
    }

    #[test]
    fn a_new_name_skips_users_of_the_machine_and_a_full_range_refuses_it() {
        let key = [1u8; 32];
        let mut table = Table::new();
        let want = give(&mut table.clone(), &["x"], RANGE, &key, &nobody).uids["x"];
        let got = give(&mut table, &["x"], RANGE, &key, &|u| u == want).uids["x"];
        assert_eq!(got, if want == RANGE.1 { RANGE.0 } else { want + 1 }, "the next free uid, wrapping");
        // Every uid of the range held: refused, the table unchanged.
        let mut full: Table = (RANGE.0..=RANGE.1).map(|u| (format!("a{u}"), u)).collect();
        let before = full.clone();
        let given = give(&mut full, &["late", "a5000"], RANGE, &key, &nobody);
        assert_eq!(given.refused, vec!["late".to_string()]);
        assert_eq!(given.uids.get("a5000"), Some(&5000));
        assert_eq!(full, before);
        // All free uids taken by the machine's users: refused too.
        let given = give(&mut Table::new(), &["y"], RANGE, &key, &|_| true);
        assert_eq!(given.refused, vec!["y".to_string()]);
    }

    #[test]
    fn a_uid_outside_a_changed_range_is_kept_and_said() {
        let mut table: Table = [("old".to_string(), 1_900_000_123)].into();
        let given = give(&mut table, &["old"], RANGE, &[0; 32], &nobody);
        assert_eq!(given.uids["old"], 1_900_000_123);
        assert_eq!(given.outside, vec![("old".to_string(), 1_900_000_123)]);
        assert!(given.new.is_empty());
    }

    #[test]
    fn a_bad_table_is_named_by_line() {
        assert!(parse("# c\n\napi 1900000001\n").is_ok());
        assert!(parse("api\n").unwrap_err().starts_with("1: expected `NAME UID`"));
        assert!(parse("api 12\n").unwrap_err().contains("not a uid"));
        assert!(parse("a 5000\nb 5000\n").unwrap_err().starts_with("2: uid 5000 is given to two apps"));
        assert!(parse("a 5000\na 5001\n").unwrap_err().contains("listed twice"));
    }
}
