//! Plain R workers: the R command line and environment every worker of an
//! app shares (`Spec`), valve's private run directory, a plain worker
//! process (`Plain`: the leader of its own process group), and waiting
//! until a starting worker answers. Starting one: `launchable`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::child::Child;
use super::conn::{Conn, Connect};
use super::frames::FrameHub;
use super::job::{Io, Job};
pub(super) use super::launchable::{Launchable, Spawner};
use super::output::{Hooks, OutputHook, Sink, Tail};
use super::privsep::wire::Kind;
use super::process::{signal, Exit, MemoryProbe, Process, StartError, Stop};
use super::sandbox::{self, Prepared, Sandbox};
use super::wire::{BoxFuture, WorkerId};
use crate::config::AppSource;

/// The R code each worker runs.
const LAUNCHER: &str = include_str!("launcher.R");

/// The frames request loop the launcher sources (bench/r-loop measured it).
const LOOP: &str = include_str!("loop.R");

/// The warm parent's R code, and the C executor of an app's sandbox its
/// forks run (built by build.rs; also the forks' lifeline).
const ZYGOTE: &str = include_str!("zygote/zygote.R");
const ENTER_LIB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/valve_enter.so"));

/// What valve adds to glibc's tunables in every R process it starts: malloc
/// asks the kernel for transparent huge pages (honoured when the kernel's THP
/// mode is `madvise`, the default of many distributions; a no-op under
/// `always` or `never`, or before glibc 2.35). R's heap then takes fewer TLB
/// misses: ~5 % less R CPU on plumber's request path for ~1 % more memory
/// (bench/r-cost). Not in a parent of forks nor its forks: `parent_of_forks`.
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

/// The workers' GLIBC_TUNABLES given the value they would inherit: the
/// user's own `glibc.malloc.hugetlb` choice stands (`=0` turns this off);
/// otherwise `HUGE_PAGES` is added to whatever else they set.
pub(super) fn glibc_tunables(inherited: Option<&str>) -> Option<String> {
    match inherited.map(str::trim) {
        Some(t) if t.split(':').any(|kv| kv.trim().starts_with("glibc.malloc.hugetlb=")) => None,
        Some(t) if !t.is_empty() => Some(format!("{t}:{HUGE_PAGES}")),
        _ => Some(HUGE_PAGES.to_string()),
    }
}

/// How often a starting worker's socket is probed.
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// What every worker of one app shares.
#[derive(Debug)]
pub struct Spec {
    pub r_bin: PathBuf,
    pub app: AppSource,
    /// The address clients use, so plumber's docs and messages show it.
    pub public_host: String,
    pub public_port: u16,
    /// Extra environment for the app's workers (`env = { ... }` in a config file).
    pub env: Vec<(String, String)>,
    /// The longest a `shiny_prerendered` document's one render may take.
    pub render_timeout: Duration,
    /// The app's name, on every log event about its processes.
    pub name: Arc<str>,
    /// What hears the app's output besides valve's log (`on_output`).
    hooks: Hooks,
    run_dir: Arc<tempfile::TempDir>,
    launcher: PathBuf,
    /// Set when plumber workers are reached over frames (else httpuv).
    pub(super) frames: Option<Arc<FrameHub>>,
    /// Whom the app's workers run as, what they see and may take.
    sandbox: Option<(Arc<Sandbox>, Arc<Prepared>)>,
    /// A prerendered document's HTML, when its folder is not its user's to
    /// write: this generation's own folder (`VALVE_RENDER_DIR`).
    pub(super) render_dir: Option<PathBuf>,
    /// The app's own library paths (its restored packages first, then what
    /// valve's launcher needs), before R's own: `None`, R's defaults.
    pub library: Option<Vec<PathBuf>>,
}

/// valve's private run directory (mode 0711: passable, not listable):
/// `lib/` the launcher workers read, `apps/NAME/` each app's sockets, FIFOs
/// and spooled bodies and `tmp/NAME/` its temporary folder (each 0700, the
/// app's user's), valve's own spooled answers. Removed when the last holder
/// drops it.
pub fn run_dir() -> io::Result<Arc<tempfile::TempDir>> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("valve-").tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))?;
    write_lib(&sandbox::lib_dir(dir.path()))?;
    Ok(Arc::new(dir))
}

/// Makes `lib` (0755) with the R code and the C executor valve carries.
pub(super) fn write_lib(lib: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(lib)?;
    std::fs::set_permissions(lib, std::fs::Permissions::from_mode(0o755))?;
    for (name, bytes, mode) in [
        ("launcher.R", LAUNCHER.as_bytes(), 0o644),
        ("loop.R", LOOP.as_bytes(), 0o644),
        ("zygote.R", ZYGOTE.as_bytes(), 0o644),
        ("valve_enter.so", ENTER_LIB, 0o755),
    ] {
        std::fs::write(lib.join(name), bytes)?;
        std::fs::set_permissions(lib.join(name), std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

impl Spec {
    pub fn new(
        run_dir: Arc<tempfile::TempDir>,
        r_bin: PathBuf,
        app: AppSource,
        env: Vec<(String, String)>,
        public_host: String,
        public_port: u16,
    ) -> Self {
        let launcher = sandbox::lib_dir(run_dir.path()).join("launcher.R");
        Spec {
            r_bin,
            app,
            public_host,
            public_port,
            env,
            render_timeout: Duration::from_secs(120),
            name: Arc::from(""),
            hooks: Hooks::default(),
            run_dir,
            launcher,
            frames: None,
            sandbox: None,
            render_dir: None,
            library: None,
        }
    }

    /// The app's workers enter `sandbox` (its steps computed now, once).
    pub fn sandboxed(mut self, sandbox: Sandbox) -> io::Result<Self> {
        let prepared = sandbox.prepare()?;
        self.sandbox = Some((Arc::new(sandbox), prepared));
        Ok(self)
    }

    /// The app's run folder: its workers' FIFOs and spooled bodies, their
    /// sockets in its `own/`.
    pub fn run_folder(&self) -> io::Result<sandbox::RunFolder> {
        match &self.sandbox {
            Some((s, _)) => Ok(s.run.clone()),
            None => sandbox::RunFolder::open(self.run_dir.path()),
        }
    }

    /// A folder for this generation's render, the app's user's (when it has
    /// one of its own: else the document renders beside itself, as before),
    /// made through the run folder's handle, never through a link.
    pub(super) fn make_render_dir(&mut self) -> io::Result<()> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let Some(owner) = self.owner() else { return Ok(()) };
        let name = format!("render-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.render_dir = Some(self.run_folder()?.new_dir(&name, Some(owner))?);
        Ok(())
    }

    /// Removes this generation's render folder (nothing in it is followed).
    pub(super) fn remove_render_dir(&self) -> io::Result<()> {
        let Some(name) = self.render_dir.as_ref().and_then(|d| d.file_name()).and_then(|n| n.to_str()) else {
            return Ok(());
        };
        self.run_folder()?.remove_tree(name)
    }

    /// Who owns what valve makes for the app's workers (a FIFO), when they switch users.
    pub(super) fn owner(&self) -> Option<(u32, u32)> {
        self.sandbox.as_ref().and_then(|(s, _)| s.owner())
    }

    /// Workers of this app are reached over frames through `hub` (plumber
    /// APIs only: Shiny needs httpuv's WebSockets, an engine serves HTTP).
    pub fn over_frames(mut self, hub: Arc<FrameHub>) -> Self {
        if self.app.speaks_frames() {
            self.frames = Some(hub);
        }
        self
    }

    /// Every line the app's processes print goes to `hook` too.
    pub fn on_output(&mut self, hook: Arc<dyn OutputHook>) {
        self.hooks.push(hook);
    }

    /// Where the output of the app's process `worker` goes.
    pub(super) fn sink(&self, worker: WorkerId, tail: Arc<Tail>) -> Sink {
        Sink { app: self.name.clone(), worker, hooks: self.hooks.clone(), tail }
    }

    /// `R --file=launcher.R` with the environment every launcher mode reads,
    /// entering the app's sandbox between fork and exec.
    pub(super) fn command(&self, mode: &str) -> io::Result<Launchable> {
        let mut cmd = Job::new(&self.r_bin);
        if self.isolated() {
            // Of valve's own environment, only what `sandbox::inherited` allows.
            cmd.env_clear().envs(sandbox::allowed_env());
        }
        cmd.arg("--no-echo")
            .arg("--no-restore")
            .arg("--no-save")
            .arg(format!("--file={}", self.launcher.display()))
            .current_dir(self.app.workdir())
            .envs(self.worker_env(mode))
            .stdout(Io::Piped)
            .stderr(Io::Piped);
        let prepared = self.sandbox.as_ref().map(|(_, p)| p.clone()).filter(|p| !p.is_empty());
        Ok(Launchable::new(cmd, Kind::App, prepared).for_app(&self.name))
    }

    /// What a worker's R process has in its environment besides what it
    /// inherits from valve's: the app's own variables, its sandbox's (home,
    /// temporary folder, user), and what the launcher reads.
    pub(super) fn worker_env(&self, mode: &str) -> Vec<(String, std::ffi::OsString)> {
        let mut env: Vec<(String, std::ffi::OsString)> = self.env.iter().map(|(k, v)| (k.clone(), v.into())).collect();
        if let Some((s, _)) = &self.sandbox {
            env.extend(s.env().into_iter().map(|(k, v)| (k, v.into())));
        }
        let mut set = |k: &str, v: std::ffi::OsString| env.push((k.to_string(), v));
        set("VALVE_MODE", mode.into());
        set("VALVE_APP", self.app.path().into());
        set("VALVE_APP_KIND", self.app.kind().into());
        set("VALVE_PUBLIC_HOST", self.public_host.clone().into());
        set("VALVE_PUBLIC_PORT", self.public_port.to_string().into());
        set("VALVE_LOOP", sandbox::lib_dir(self.run_dir.path()).join("loop.R").into());
        set("VALVE_ENTER_LIB", sandbox::lib_dir(self.run_dir.path()).join("valve_enter.so").into());
        set("VALVE_TRANSPORT", if self.frames.is_some() { "frames" } else { "httpuv" }.into());
        if let Some(hub) = &self.frames {
            set("VALVE_FRAME_PORT", hub.port().to_string().into());
        }
        if let Some(dir) = &self.render_dir {
            set("VALVE_RENDER_DIR", dir.into());
        }
        if let Some(paths) = &self.library {
            // The launcher sets them without the site library; R's own
            // variables carry them to any R the app starts (R CMD, callr).
            let joined = std::env::join_paths(paths).unwrap_or_default();
            for name in ["VALVE_LIBRARY", "R_LIBS", "R_LIBS_USER", "R_LIBS_SITE"] {
                set(name, joined.clone());
            }
        }
        if let AppSource::ServerYml { settings, engine, .. } = &self.app {
            set("VALVE_ENGINE", engine.into());
            set("VALVE_SETTINGS", settings.into());
        }
        let inherited = match self.env.iter().rev().find(|(k, _)| k == "GLIBC_TUNABLES") {
            Some((_, v)) => Some(v.clone()),
            None => std::env::var("GLIBC_TUNABLES").ok(),
        };
        // Set even when it is the user's own choice unchanged: an isolated
        // worker inherits nothing of valve's environment but what is allowed.
        if let Some(tunables) = glibc_tunables(inherited.as_deref()).or(inherited) {
            set("GLIBC_TUNABLES", tunables.into());
        }
        env
    }

    /// Whether the app is kept from the others (its own user, or Landlock):
    /// then its workers inherit only what `sandbox::inherited` allows.
    pub(super) fn isolated(&self) -> bool {
        self.sandbox.as_ref().is_some_and(|(s, _)| s.isolated())
    }

    /// The uid a worker's socket must be served by: the app's user's, or
    /// valve's own (a socket in the app's `own/` folder may be the app's link).
    pub(super) fn peer_uid(&self) -> u32 {
        self.owner().map(|(uid, _)| uid).unwrap_or_else(|| rustix::process::geteuid().as_raw())
    }

    /// The sandbox's steps for the C executor of a warm parent's fork.
    pub(super) fn fork_steps(&self) -> Vec<String> {
        self.sandbox.as_ref().map(|(_, p)| p.lines().to_vec()).unwrap_or_default()
    }

    /// Worker `id`'s own frames token (none for a Shiny, httpuv or engine worker).
    pub(super) fn frame_token(&self, id: WorkerId) -> Option<String> {
        self.frames.as_ref().map(|hub| hub.token(id))
    }

    /// Worker `id`'s socket, in the app's `own/` folder (its R creates it).
    pub(super) fn socket_path(&self, id: WorkerId) -> io::Result<PathBuf> {
        Ok(self.run_folder()?.own().join(format!("w{id}.sock")))
    }
}

/// A plain worker: the leader of its own process group.
pub(super) struct Plain {
    child: Child,
    pid: u32,
    tail: Arc<Tail>,
    exit: Option<Exit>,
}

impl Plain {
    pub(super) fn new(child: Child, pid: u32, tail: Arc<Tail>) -> Self {
        Plain { child, pid, tail, exit: None }
    }
}

impl Process for Plain {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    fn ready<'a>(
        &'a mut self,
        connector: &'a dyn Connect,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Conn, StartError>> {
        Box::pin(async move {
            let tail = self.tail.clone();
            connector.expect_pid(self.pid);
            let answered = tokio::time::timeout(timeout, wait_answering(connector));
            tokio::select! {
                ready = answered => ready.map_err(|_| match connector.listens_on() {
                    Some((addr, listened)) => {
                        StartError::NeverListened { addr: addr.to_string(), timeout, listened, tail: tail.lines() }
                    }
                    None => StartError::Timeout(timeout, tail.lines()),
                }),
                exit = self.exited() => {
                    // Let the output readers catch R's last words.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let code = match exit { Exit::Code(c) => Some(c), _ => None };
                    Err(StartError::Exited { status: exit.describe(), code, tail: tail.lines() })
                }
            }
        })
    }

    fn exited(&mut self) -> BoxFuture<'_, Exit> {
        Box::pin(async move {
            if let Some(exit) = &self.exit {
                return exit.clone();
            }
            // Anything the worker started in its group goes with it.
            let exit = match self.child.wait().await {
                Ok(status) => Exit::from_status(status),
                Err(_) => Exit::Unknown,
            };
            self.exit = Some(exit.clone());
            exit
        })
    }

    fn signal(&self, stop: Stop) {
        if self.exit.is_some() {
            return;
        }
        // The whole group: whatever R started (a `system()` call) stops too.
        // Safe: the leader is not reaped before `exited` has seen its exit.
        self.child.signal_group(signal(stop));
    }

    fn memory(&self) -> Option<MemoryProbe> {
        Some(MemoryProbe { pid: self.pid, private_only: false })
    }
}

/// Probes until the worker answers.
pub(super) async fn wait_answering(connector: &dyn Connect) -> Conn {
    loop {
        if let Ok(conn) = connector.probe().await {
            return conn;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}
#[cfg(test)]
mod tests {
    use super::glibc_tunables;

    #[test]
    fn workers_ask_for_huge_pages_unless_the_user_chose() {
        assert_eq!(glibc_tunables(None).as_deref(), Some("glibc.malloc.hugetlb=1"));
        assert_eq!(glibc_tunables(Some("")).as_deref(), Some("glibc.malloc.hugetlb=1"));
        assert_eq!(
            glibc_tunables(Some("glibc.malloc.arena_max=2")).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
            "the user's other tunables are kept"
        );
        assert_eq!(glibc_tunables(Some("glibc.malloc.hugetlb=0")), None, "=0 turns it off");
        assert_eq!(glibc_tunables(Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2")), None);
    }
}
