//! The app uid table on disk: `STATE_DIR/uids` (`NAME UID` a line, mode
//! 0600) and the key that places a new name (`STATE_DIR/uids.key`, 0600,
//! made when a first new name needs it). With publishing on, both live in
//! `publish_dir` instead, which replicas share: every valve serving the site
//! gives an app the same uid, so a version one of them gave to its app's
//! group is readable by that app on all of them (moved there once from the
//! state folder, where a valve before this one kept them). Read at start and at each reload,
//! written only when a name is new (temporary file, fsync, rename), never
//! under `--check`. The decisions are `uids`'; this is their edge on the disk.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::secret_file::{self, Holds};
use super::uids::{self, Table};

/// Where the table is and whether this load may write it.
#[derive(Clone, Debug)]
pub struct Store {
    pub dir: PathBuf,
    /// False under `--check`: read, say what would be given, write nothing.
    pub record: bool,
    /// Where the table was kept before (the state folder, when it is now
    /// in `publish_dir`): read from there until it is written here.
    pub moved_from: Option<PathBuf>,
}

/// Said about the uids when a configuration is loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UidNotes {
    /// Uids given now (or, under `--check`, that would be).
    pub notes: Vec<String>,
    /// Uids kept outside a changed `uid_range`.
    pub warnings: Vec<String>,
}

/// The uids of `own` (the apps that get a user of their own; `names` are
/// all the apps, for the first run's seeding), names refused a uid with why,
/// and what to say.
pub struct Assigned {
    pub uids: BTreeMap<String, u32>,
    pub refused: Vec<(String, String)>,
    pub said: UidNotes,
}

/// A name of the table as messages say it: an app, or a package builder.
fn who(name: &str) -> String {
    match name.strip_prefix(".builder-") {
        Some(n) => format!("package builder {n}"),
        None => format!("app `{name}`"),
    }
}

impl Store {
    /// The table of a site: in `publish_dir` if publishing is on, else in `state_dir`.
    pub fn of_site(state_dir: &Path, publish_dir: Option<&Path>, record: bool) -> Store {
        match publish_dir {
            Some(p) => Store { dir: p.to_path_buf(), record, moved_from: Some(state_dir.to_path_buf()) },
            None => Store { dir: state_dir.to_path_buf(), record, moved_from: None },
        }
    }

    /// The folder's setting, in messages.
    fn label(&self) -> &'static str {
        if self.moved_from.is_some() {
            "publish_dir"
        } else {
            "state_dir"
        }
    }

    fn table_path(&self) -> PathBuf {
        self.dir.join("uids")
    }

    /// Moves (copies, then leaves as they were) the table and its key from
    /// where a valve before kept them, if they are not here yet.
    fn move_in(&self) -> Result<Option<String>, String> {
        let Some(old) = &self.moved_from else { return Ok(None) };
        if self.table_path().exists() || !old.join("uids").exists() {
            return Ok(None);
        }
        for name in ["uids.key", "uids"] {
            let (from, to) = (old.join(name), self.dir.join(name));
            if !from.exists() || to.exists() {
                continue;
            }
            let tmp = self.dir.join(format!("{name}.tmp.{}", std::process::id()));
            std::fs::copy(&from, &tmp)
                .and_then(|_| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)))
                .and_then(|()| std::fs::rename(&tmp, &to))
                .map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()))?;
        }
        Ok(Some(format!(
            "app uids: the table moved from {} to {}, where every valve sharing {} reads it",
            old.display(),
            self.dir.display(),
            self.label()
        )))
    }

    /// Gives each of `own` its uid; `taken` says a uid is a user of the
    /// machine or an app's `run_as`. An error is about the table or its
    /// folder, and stops the whole configuration.
    pub fn assign(
        &self,
        names: &[&str],
        own: &[&str],
        range: (u32, u32),
        taken: &dyn Fn(u32) -> bool,
    ) -> Result<Assigned, String> {
        let path = self.table_path();
        // Valves sharing a state folder (two on one host, or replicas) take
        // turns: each reads, gives and writes the table whole under the lock.
        // A folder valve may only read (a replica's read-only mount): the
        // table is read as it is (written whole, by rename); only a new name
        // needs writing, and says why it cannot.
        let _turn = if self.record { self.lock()? } else { None };
        let moved = if self.record { self.move_in()? } else { None };
        let unmoved = self.moved_from.as_ref().map(|d| d.join("uids")).filter(|p| !path.exists() && p.exists());
        let found = self.read_table(unmoved.as_deref().unwrap_or(&path))?;
        let seeded = found.is_none();
        let mut table = found.unwrap_or_else(|| uids::seed(names, own, range));
        let mut said = UidNotes::default();
        said.notes.extend(moved);
        let new_names = own.iter().any(|n| !table.contains_key(*n));
        let key_path = self.dir.join("uids.key");
        let (key, provisional) = if !new_names {
            ([0u8; 32], false)
        } else if self.record || key_path.exists() {
            (secret_file::key_in(&key_path, "the app uid key")?, false)
        } else {
            // --check before any key exists: where a new name lands is known at start only.
            let mut k = [0u8; 32];
            let _ = rustix::rand::getrandom(&mut k, rustix::rand::GetRandomFlags::empty());
            (k, true)
        };
        let given = uids::give(&mut table, own, range, &key, taken);
        let (lo, hi) = range;
        let refused = given
            .refused
            .iter()
            .map(|name| {
                (
                    name.clone(),
                    format!(
                        "{}: no uid of uid_range {lo}-{hi} is free for it (each is an app's in {} or a user's of this machine): widen uid_range, or set run_as for this app",
                        who(name),
                        path.display()
                    ),
                )
            })
            .collect::<Vec<_>>();
        for (name, uid) in &given.outside {
            said.warnings.push(format!(
                "app `{name}` keeps uid {uid} from {}, outside uid_range {lo}-{hi}: a uid never moves, its files are owned by it (to move it, stop valve, chown the app's files and remove its line)",
                path.display()
            ));
        }
        let where_ = path.display();
        if seeded && !table.is_empty() {
            let n = table.len() - given.new.len();
            if n > 0 {
                said.notes.push(match self.record {
                    true => format!("app uids: {n} recorded in {where_}, each as valve gave it before it kept them"),
                    false => format!("app uids: {n} would be recorded in {where_} at start, each as valve gives it now (--check writes nothing)"),
                });
            }
        }
        for (name, uid) in &given.new {
            let who = who(name);
            said.notes.push(match (self.record, provisional) {
                (true, _) => format!("{who} is given uid {uid}, recorded in {where_}: it keeps it from now on"),
                (false, false) => format!("{who} is new: valve would give it uid {uid} at start (--check writes nothing)"),
                (false, true) => format!("{who} is new: valve gives it a free uid of uid_range at start, picked with a key made then (uid {uid} shown is an example; --check writes nothing)"),
            });
        }
        if self.record && refused.is_empty() && (!given.new.is_empty() || (seeded && !table.is_empty())) {
            self.write_table(&path, &table)?;
        }
        Ok(Assigned { uids: given.uids, refused, said })
    }

    /// Retires `name`'s uid, if the table gives it one: the entry is kept
    /// under a name no app can have (`~NAME@UNIX-TIME`), so the uid is never
    /// given again and `name`, published anew, gets a fresh one. The uid it
    /// had, if any.
    pub fn retire(&self, name: &str) -> Result<Option<u32>, String> {
        let _turn = self.lock()?;
        let path = self.table_path();
        let Some(mut table) = self.read_table(&path)? else { return Ok(None) };
        let Some(uid) = table.remove(name) else { return Ok(None) };
        let when = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        table.insert(format!("~{name}@{when}"), uid);
        self.write_table(&path, &table)?;
        Ok(Some(uid))
    }

    /// The uid the table gives `name`, read now (`None`: no such name, or no
    /// table that can be read).
    pub fn known(&self, name: &str) -> Option<u32> {
        self.read_table(&self.table_path()).ok().flatten()?.get(name).copied()
    }

    /// The table, or `None` when there is none yet.
    fn read_table(&self, path: &Path) -> Result<Option<Table>, String> {
        let what = "the app uid table";
        let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path);
        let mut file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(format!("{what} {}: cannot read it: {e} (a symbolic link is not followed)", path.display()))
            }
        };
        secret_file::check(&self.dir, self.label(), Holds::NoSecret)?;
        let meta = file.metadata().map_err(|e| format!("{what} {}: {e}", path.display()))?;
        secret_file::judge_meta(path, what, &meta, Holds::NoSecret)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))?;
        uids::parse(&text).map(Some).map_err(|e| {
            format!(
                "{what} {}:{e} (valve writes it; restore it from a backup: a uid must not move, or its app's files change owner)",
                path.display()
            )
        })
    }

    /// The state folder, made (0711) if it is not there.
    fn make_dir(&self) -> Result<(), String> {
        if !self.dir.exists() {
            std::fs::create_dir_all(&self.dir)
                .and_then(|()| std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o711)))
                .map_err(|e| format!("{} {}: cannot create it: {e}", self.label(), self.dir.display()))?;
        }
        Ok(())
    }

    /// `uids.lock` in the table's folder, held (flock) until dropped; none
    /// when the folder is read-only.
    fn lock(&self) -> Result<Option<std::fs::File>, String> {
        use std::os::fd::AsRawFd;
        self.make_dir()?;
        let path = self.dir.join("uids.lock");
        let bad = |e: std::io::Error| format!("the app uid table's lock {}: {e}", path.display());
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => return Ok(None),
            Err(e) => return Err(bad(e)),
        };
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(bad(std::io::Error::last_os_error()));
        }
        Ok(Some(file))
    }

    /// Writes the table whole, in one step: a reader sees the old or the new.
    fn write_table(&self, path: &Path, table: &Table) -> Result<(), String> {
        let bad = |e: std::io::Error| format!("the app uid table {}: cannot write it: {e}", path.display());
        self.make_dir()?;
        secret_file::check(&self.dir, self.label(), Holds::NoSecret)?;
        let tmp = self.dir.join(format!("uids.tmp.{}", std::process::id()));
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(bad(e)),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(bad)?;
        file.write_all(uids::render(table).as_bytes()).and_then(|()| file.sync_all()).map_err(bad)?;
        std::fs::rename(&tmp, path).map_err(bad)?;
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_seeded_written_once_read_back_and_never_written_under_check() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state");
        let range = (5000, 5999);
        let check = Store::of_site(&dir, None, false);
        let a = check.assign(&["api", "site"], &["api"], range, &|_| false).unwrap();
        assert!(!dir.exists(), "--check writes nothing, not even the folder");
        assert!(a.said.notes[0].contains("would be recorded"), "{:?}", a.said);
        let store = Store::of_site(&dir, None, true);
        let b = store.assign(&["api", "site"], &["api"], range, &|_| false).unwrap();
        assert_eq!(a.uids, b.uids, "what --check says is what start gives");
        assert_eq!(
            std::fs::read_to_string(dir.join("uids")).unwrap().lines().last(),
            Some(&*format!("api {}", b.uids["api"]))
        );
        assert!(!dir.join("uids.key").exists(), "no key until a new name needs one");
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(dir.join("uids")).unwrap().mode() & 0o777, 0o600);
        // A new name: keyed, recorded; the key made 0600.
        let c = store.assign(&["api", "new"], &["api", "new"], range, &|_| false).unwrap();
        assert_eq!(c.uids["api"], b.uids["api"]);
        assert!(c.said.notes.iter().any(|n| n.contains("app `new` is given uid")), "{:?}", c.said);
        assert_eq!(std::fs::metadata(dir.join("uids.key")).unwrap().mode() & 0o777, 0o600);
        let again = store.assign(&["new"], &["new"], range, &|_| false).unwrap();
        assert_eq!(again.uids["new"], c.uids["new"]);
        assert!(again.said.notes.is_empty());
        // A table others may change is refused, naming it.
        std::fs::set_permissions(dir.join("uids"), std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = store.assign(&["new"], &["new"], range, &|_| false).err().unwrap();
        assert!(e.contains("uids") && e.contains("0666"), "{e}");
        std::fs::write(dir.join("uids"), "new x\n").unwrap();
        std::fs::set_permissions(dir.join("uids"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = store.assign(&["new"], &["new"], range, &|_| false).err().unwrap();
        assert!(e.contains(":1: ") && e.contains("backup"), "{e}");
    }

    #[test]
    fn with_publishing_the_table_moves_to_publish_dir_once_and_two_valves_sharing_it_give_one_uid() {
        let d = tempfile::tempdir().unwrap();
        let (state, other, shared) = (d.path().join("state"), d.path().join("other"), d.path().join("published"));
        let range = (5000, 5999);
        // Given before publishing shared the table: in the state folder.
        let before = Store::of_site(&state, None, true).assign(&["api"], &["api"], range, &|_| false).unwrap();
        let store = Store::of_site(&state, Some(&shared), true);
        let moved = store.assign(&["api", "pub"], &["api", "pub"], range, &|_| false).unwrap();
        assert_eq!(moved.uids["api"], before.uids["api"], "a uid never moves");
        assert!(moved.said.notes.iter().any(|n| n.contains("moved from")), "{:?}", moved.said);
        assert!(shared.join("uids").exists() && shared.join("uids.key").exists());
        // Another valve, another state folder, the same publish_dir: the same uids.
        let there = Store::of_site(&other, Some(&shared), true).assign(&["pub"], &["pub"], range, &|_| false).unwrap();
        assert_eq!(there.uids["pub"], moved.uids["pub"]);
        assert!(!other.join("uids").exists(), "nothing kept apart in its own state folder");
    }
}
