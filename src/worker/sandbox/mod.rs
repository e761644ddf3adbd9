//! A worker's sandbox: whom it runs as, what it sees, what it may take.
//! Decided once per app generation as a plain value (`Sandbox`, from the
//! app's settled account and the site's paths), turned into steps (`view`,
//! pure) and entered by one function between fork and exec (`enter`), in
//! the order bubblewrap and systemd use: namespace and mounts, limits,
//! groups, gid, uid, no new privileges; without root, the app's Landlock
//! ruleset last (`landlock`: everything read but what a view would hide, its
//! own folders written). `probe` measures what the kernel allows before the
//! configuration is read; `dirs` makes each app's private folders (its
//! home, its temporary folder, its run folder) owned by its user.

mod as_user;
pub mod build;
mod dirs;
mod enter;
pub mod landlock;
mod probe;
pub(crate) mod safe;
pub mod view;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use as_user::{as_user, ids_of};
pub use dirs::RunFolder;
pub use enter::{Owned as SandboxSpec, Prepared};
pub use probe::{guard_valve, probe};
pub use view::View;

use crate::config::{Account, AppConfig, Config, Isolation};

/// What the OOM killer adds to an R worker's badness: with it, a worker is
/// always chosen before valve (whose own score stays as the system set it).
pub const OOM_SCORE_ADJ: i32 = 500;

/// The paths a configuration holds that isolation needs: every app's
/// folder (each app hides the others'), valve's own files, where private
/// folders go.
#[derive(Clone, Debug)]
pub struct Site {
    pub isolation: Isolation,
    pub state_dir: PathBuf,
    /// valve's own files: the config file, the site folder, the state directory.
    pub private: Vec<PathBuf>,
    /// Every app's name and folder.
    pub folders: Vec<(String, PathBuf)>,
    /// The package cache (every app's library links into it): seen by all apps.
    pub packages: PathBuf,
}

impl Site {
    pub fn of(config: &Config) -> Site {
        let mut private: Vec<PathBuf> = config.server.private_paths.iter().map(|p| absolute(p)).collect();
        if let Some(p) = &config.server.publish {
            // Published apps' folders are hidden as apps' folders; the keys and records too.
            private.push(absolute(&p.dir));
            private.push(absolute(&p.keys_file));
        }
        // Every other file valve is configured to read or write.
        private.extend(configured_files(config).iter().map(|p| absolute(p)));
        // Builds under way, and libraries on their way into the cache.
        private.push(absolute(&config.server.packages.cache_dir.join("tmp")));
        Site {
            isolation: config.server.isolation,
            state_dir: absolute(&config.server.state_dir),
            private,
            folders: config.apps.iter().map(|a| (a.name.clone(), absolute(&a.folder()))).collect(),
            packages: absolute(&config.server.packages.cache_dir),
        }
    }
}

/// The files and folders valve reads or writes because its settings name
/// them (certificates and keys, the ACME folder and its authority's roots,
/// the usage log and its key): hidden from every app, whatever the level.
pub fn configured_files(config: &Config) -> Vec<PathBuf> {
    use crate::config::tls::{AdminTls, CertSource};
    let mut out = Vec::new();
    if let Some(tls) = &config.server.tls {
        match &tls.certs {
            CertSource::Files { cert, key } => out.extend([cert.clone(), key.clone()]),
            CertSource::Acme(acme) => {
                out.push(acme.dir.clone());
                out.extend(acme.ca.clone());
            }
        }
        if let AdminTls::Own { cert, key } = &tls.admin {
            out.extend([cert.clone(), key.clone()]);
        }
    }
    if let Some(log) = &config.server.usage_log {
        out.push(log.clone());
        let mut key = log.clone().into_os_string();
        key.push(".key");
        out.push(PathBuf::from(key));
    }
    out
}

/// Everything a worker of one app is, sees and may take.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub account: Account,
    /// Workers become `account` (valve is root and the account is not).
    pub switch: bool,
    /// `HOME`: the app's private home (or a named user's own).
    pub home: Option<PathBuf>,
    /// The app's private temporary folder (`TMPDIR`; `/tmp` in its view).
    pub tmp: Option<PathBuf>,
    /// The app's run folder (valve's): its workers' FIFOs and spooled
    /// bodies, and in `own/` (the app's user's) their sockets.
    pub run: RunFolder,
    /// Its private view of the files, where the kernel allows one.
    pub view: Option<View>,
    /// Its Landlock rules (valve without root: the app shares valve's user).
    pub landlock: Option<landlock::Rules>,
    pub memory_limit: Option<u64>,
    /// Its working directory.
    pub workdir: PathBuf,
}

/// Where valve's run directory keeps what workers read (the launcher).
pub fn lib_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("lib")
}

impl Sandbox {
    /// Decides the sandbox of `app`'s workers and makes its private folders.
    /// `env` is the environment workers inherit (R's library paths in it stay visible).
    pub fn for_app(app: &AppConfig, site: &Site, run_dir: &Path) -> io::Result<Sandbox> {
        let workdir = absolute(&app.source.workdir());
        let account = app.account.clone();
        let switch = account.isolated();
        let landlock = match site.isolation {
            Isolation::Landlock(abi) if !switch => Some(abi),
            _ => None,
        };
        let run = dirs::app_run_dir(run_dir, &app.name, switch.then_some(&account))?;
        if !switch && landlock.is_none() {
            return Ok(Sandbox {
                account,
                switch,
                home: None,
                tmp: None,
                run,
                view: None,
                landlock: None,
                memory_limit: app.memory_limit,
                workdir,
            });
        }
        let owner = switch.then_some(&account);
        let tmp = dirs::private_tmp(run_dir, &app.name, owner)?;
        let home = match &account.home {
            Some(h) => h.clone(),
            None => match dirs::private_home(&site.state_dir, &app.name, owner, app.instance.as_deref()) {
                Ok(h) => h,
                // Without root, a state folder valve cannot write (a container's
                // read-only root) costs the app a home that lasts, not its start.
                Err(e) if !switch => {
                    tracing::warn!(app = %app.name, error = %e,
                        "the app's home is temporary (in valve's run directory, gone when valve stops): set --state-dir to a folder valve can write to keep it");
                    dirs::private_tmp(&run_dir.join("homes"), &app.name, None)?
                }
                Err(e) => return Err(e),
            },
        };
        let own = absolute(&app.folder());
        let mut hide: Vec<PathBuf> = site
            .folders
            .iter()
            .filter(|(name, folder)| *name != app.name && *folder != own)
            .map(|(_, f)| f.clone())
            .collect();
        hide.extend(site.private.iter().cloned());
        hide.push(run_dir.to_path_buf());
        hide.extend(["/home", "/root"].map(PathBuf::from));
        let mut show = vec![own.clone(), home.clone(), run.path().to_path_buf(), lib_dir(run_dir)];
        // Its working directory, where that is not its folder (a router
        // saved with saveRDS() runs where valve was started).
        if !workdir.starts_with(&own) {
            show.push(workdir.clone());
        }
        show.extend(r_paths(app));
        if site.packages.is_dir() {
            show.push(site.packages.clone());
        }
        let landlock = landlock.map(|abi| landlock_rules(abi, hide.clone(), show.clone(), &own, &home, &tmp, &run));
        let view = (site.isolation == Isolation::View).then(|| View {
            hide,
            show,
            tmp_at: vec![PathBuf::from("/tmp"), PathBuf::from("/var/tmp")],
            scratch: vec![PathBuf::from("/dev/shm")],
            tmp: tmp.clone(),
        });
        Ok(Sandbox {
            account,
            switch,
            home: Some(home),
            tmp: Some(tmp),
            run,
            view,
            landlock,
            memory_limit: app.memory_limit,
            workdir,
        })
    }

    /// Whether the app is kept from the others at all (its own user, or Landlock).
    pub fn isolated(&self) -> bool {
        self.switch || self.landlock.is_some()
    }

    /// The steps and values a forked child needs, computed now.
    pub fn prepare(&self) -> io::Result<Arc<Prepared>> {
        let steps = self.view.as_ref().map(|v| {
            let account = &self.account;
            view::plan(
                v,
                |p| match std::fs::metadata(p) {
                    Ok(m) if m.is_dir() => view::Kind::Folder,
                    Ok(_) => view::Kind::File,
                    Err(_) => view::Kind::Missing,
                },
                |p| crate::config::blocked_ancestor(account, p),
            )
        });
        let groups = self.account.groups.clone();
        Ok(Arc::new(Prepared::new(enter::Spec {
            steps: steps.as_ref(),
            workdir: Some(self.workdir.as_path()),
            data_limit: self.memory_limit,
            oom_score_adj: Some(OOM_SCORE_ADJ),
            ids: self.switch.then_some((self.account.uid, self.account.gid, groups.as_slice())),
            landlock: self.landlock.as_ref(),
        })?))
    }

    /// The environment a worker gets on top of valve's: its home and
    /// temporary folder and its user's name when it switches users.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(h) = &self.home {
            env.push(("HOME".into(), h.display().to_string()));
        }
        let tmp = match (&self.view, &self.tmp) {
            (Some(_), _) if Path::new("/tmp").is_dir() => Some("/tmp".to_string()),
            (_, Some(t)) => Some(t.display().to_string()),
            _ => None,
        };
        if let Some(t) = tmp {
            env.push(("TMPDIR".into(), t));
        }
        if self.switch {
            env.push(("USER".into(), self.account.name.clone()));
            env.push(("LOGNAME".into(), self.account.name.clone()));
        }
        env
    }

    /// A file valve makes for this app's workers (a FIFO, a spooled body) is theirs.
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.switch.then_some((self.account.uid, self.account.gid))
    }
}

/// An app's Landlock rules without root: everything read but what is
/// hidden (as a private view hides it, and the shared temporary folders,
/// valve's user's home but its R library); what a view shows, read; its
/// folder, home, temporary folder, its run folder's `own/` (its sockets)
/// and the terminal devices, written. Its run folder itself is valve's:
/// the app may write into what valve made there (its FIFOs), never make,
/// remove, rename or link an entry, so nothing it plants is ever read.
fn landlock_rules(
    abi: u32,
    mut hide: Vec<PathBuf>,
    mut read: Vec<PathBuf>,
    own: &Path,
    home: &Path,
    tmp: &Path,
    run: &RunFolder,
) -> landlock::Rules {
    hide.extend(["/tmp", "/var/tmp", "/dev/shm"].map(PathBuf::from));
    if let Some(h) = std::env::var_os("HOME").map(PathBuf::from).filter(|h| h.is_absolute() && h != Path::new("/")) {
        // A laptop's R library is in the user's home (~/R/...).
        read.push(h.join("R"));
        hide.push(h);
    }
    let mut write = vec![own.to_path_buf(), home.to_path_buf(), tmp.to_path_buf(), run.own().to_path_buf()];
    write.extend(["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts"].map(PathBuf::from));
    landlock::plan_with(abi, &hide, &read, &[run.path().to_path_buf()], &write)
}

/// Whether a variable of valve's environment reaches an isolated app's R:
/// the search path, the locale and time zone, and R's own (`R_*`: library
/// paths, R's settings). Nothing else valve has (a site's secrets, root's
/// session folders) does; the app's own `env` and what valve sets for the
/// worker (HOME, TMPDIR, USER, LOGNAME, VALVE_*...) are added on top. The
/// one list, for fresh R and warm forks alike.
pub fn inherited(name: &str) -> bool {
    matches!(name, "PATH" | "LANG" | "LANGUAGE" | "TZ") || name.starts_with("LC_") || name.starts_with("R_")
}

/// Valve's variables a worker that inherits only what is allowed keeps.
pub fn allowed_env() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(inherited)).collect()
}

/// `p` from the root: mounts and the worker's working directory need whole paths.
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// R's library folders and the R binary's folder: the app needs them
/// whatever covers them (a library in root's home, a wrapper script).
fn r_paths(app: &AppConfig) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let from_env =
        |k: &str| app.env.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone()).or_else(|| std::env::var(k).ok());
    for key in ["R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"] {
        if let Some(v) = from_env(key) {
            out.extend(v.split(':').map(PathBuf::from).filter(|p| p.is_absolute()));
        }
    }
    if let Some(q) = from_env("QUARTO_PATH") {
        out.extend(Path::new(&q).parent().map(Path::to_path_buf));
    }
    if app.r_bin.is_absolute() {
        out.extend(app.r_bin.parent().map(Path::to_path_buf));
    }
    out
}
