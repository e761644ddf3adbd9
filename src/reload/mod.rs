//! The apps being served, and changing them while they serve.
//!
//! Each app serves from one generation (a `Supervisor` with its workers).
//! A reload reads the configuration again and compares each app's entry and
//! the fingerprint of its files with what serves:
//! - an app added starts, and is mounted once its first workers answer;
//! - an app removed is unmounted at once; its generation finishes its
//!   requests, gives Shiny sessions the graceful timeout, and stops;
//! - an app changed gets a new generation beside the old one, which gives up
//!   its places in the worker budget as the new one needs them. Once the new
//!   generation answers (one worker at least, even for an app that scales to
//!   zero) it takes new requests and sessions; the old one finishes its
//!   requests and keeps serving the Shiny sessions it holds until they close
//!   (`OLD_GENERATION_MAX` at most), then stops. A new generation that cannot
//!   start is stopped and the old one keeps serving.
//!
//! Static content has a generation too (router, status, metrics), with an
//! empty pool: it is mounted at once and never starts a worker.
//!
//! Reloads run one at a time, may come faster than apps start (a generation
//! still starting that the next reload no longer wants is stopped), and
//! never leave the router without an app that was serving.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::app::{Fleet, Settings, Supervisor};
use crate::config::{AppConfig, AppSource, Config, Trust};
use crate::http::router::{Mounted, Router, Table};
use crate::metrics::Registry;
use crate::restore::Library;
use crate::worker::sandbox::{Sandbox, Site};
use crate::worker::zygote::Zygotes;
use crate::worker::{FrameHub, NoWorkers, RLauncher, Spec, SpoolDir, StartError};

mod fingerprint;
mod packages;
mod reloader;
pub use fingerprint::fingerprint;
pub use reloader::Reloader;

/// Why valve could not serve.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr}: {error}{hint}")]
    Bind { addr: String, error: std::io::Error, hint: &'static str },
    #[error("cannot create the private run directory: {0} (check TMPDIR)")]
    RunDir(std::io::Error),
    #[error("cannot listen on loopback for workers: {0} (or run with --worker-transport httpuv)")]
    WorkerListener(std::io::Error),
    #[error("the app {app} ({path}) could not start: {error}")]
    Start { app: String, path: String, error: StartError },
    #[error(
        "cannot make the private folders of app {app}: {error} (valve makes them in its run directory and --state-dir)"
    )]
    Sandbox { app: String, error: std::io::Error },
    #[error("{0}")]
    Usage(crate::usage::OpenError),
    #[error("{0}")]
    Packages(String),
    #[error("HTTPS: {0}")]
    Tls(String),
    #[error("the admin pages: {0}")]
    Admin(String),
}

/// How long the previous generation of a changed app keeps the Shiny
/// sessions (and long requests) it holds: until they end, but not forever.
pub const OLD_GENERATION_MAX: Duration = Duration::from_secs(3600);

/// What a reload did, by app name.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Plan {
    /// Apps that start (mounted once they answer).
    pub added: Vec<String>,
    /// Apps that get a new generation (it takes over once it answers).
    pub changed: Vec<String>,
    /// Apps unmounted (their workers finish what they have, then stop).
    pub removed: Vec<String>,
    pub unchanged: Vec<String>,
}

/// What became of a new generation a reload started: it serves now, or it
/// could not start (the previous one, if any, serves on). A deployment
/// waits for its own.
#[derive(Clone, Debug)]
pub struct Promoted {
    pub app: String,
    /// The app's path (a published app's version folder).
    pub path: std::path::PathBuf,
    pub result: Result<(), String>,
}

/// What every app's workers start from, shared by all apps.
pub struct Starters {
    pub run_dir: Arc<tempfile::TempDir>,
    /// valve's own worker protocol's listener (plumber apps), unless `--worker-transport httpuv`.
    pub frames: Option<Arc<FrameHub>>,
    /// The warm parents apps' workers fork from (none with `warm_parent = false`).
    pub zygotes: Option<Arc<Zygotes>>,
    /// Who fetches and builds apps' packages (never the apps).
    pub builders: Arc<crate::worker::builders::Builders>,
}

/// Every app and its generations.
pub struct Apps {
    router: Arc<Router>,
    fleet: Arc<Fleet>,
    registry: Arc<Registry>,
    starters: Starters,
    /// Where valve listens (workers are told, for the URLs apps build).
    host: String,
    port: u16,
    state: Mutex<State>,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
    /// Winding-down generations and starting ones.
    tasks: TaskTracker,
    /// What became of each new generation, for whoever listens.
    promoted: tokio::sync::broadcast::Sender<Promoted>,
    /// Counts the old generations that have stopped (a published version
    /// one of them used may be removed now).
    ended: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    serving: BTreeMap<String, Serving>,
    starting: BTreeMap<String, Starting>,
    /// The settings of the last configuration applied.
    check_unused: Duration,
    grace: Duration,
    /// Whom valve believes about who calls (the router's table carries it).
    trust: Arc<Trust>,
    /// Every app's folder and valve's own files, which each app's sandbox hides.
    site: Option<Site>,
    next: u64,
    /// Old generations winding down, with their app's path.
    winding: Vec<(Arc<Supervisor>, std::path::PathBuf)>,
    /// Configured apps that serve no version: why (their packages' restore
    /// or their first start failed). Status shows them.
    failed: BTreeMap<String, String>,
}

/// An app that serves: its current generation and older ones still finishing.
struct Serving {
    config: AppConfig,
    print: u64,
    sup: Arc<Supervisor>,
    older: Vec<Arc<Supervisor>>,
}

/// A generation on its way: it takes over once it answers.
struct Starting {
    config: AppConfig,
    print: u64,
    sup: Arc<Supervisor>,
    id: u64,
}

impl Apps {
    pub fn new(
        router: Arc<Router>,
        fleet: Arc<Fleet>,
        registry: Arc<Registry>,
        starters: Starters,
        config: &Config,
        port: u16,
    ) -> Arc<Apps> {
        // Each app's log, before anything is said about the app.
        for app in &config.apps {
            registry.logs.app(&app.name, app.log_buffer);
        }
        Arc::new(Apps {
            router,
            fleet,
            registry,
            starters,
            host: config.server.host.clone(),
            port,
            state: Mutex::new(State {
                check_unused: config.server.check_unused,
                grace: config.server.graceful_timeout,
                trust: Arc::new(config.server.trust.clone()),
                ..State::default()
            }),
            reloading: tokio::sync::Mutex::new(()),
            tasks: TaskTracker::new(),
            promoted: tokio::sync::broadcast::channel(64).0,
            ended: tokio::sync::watch::channel(0).0,
        })
    }

    /// Tells of every new generation from now on: serving, or failed.
    pub fn promotions(&self) -> tokio::sync::broadcast::Receiver<Promoted> {
        self.promoted.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn generation(
        &self,
        app: &AppConfig,
        check_unused: Duration,
        site: &Site,
        library: Option<&Library>,
    ) -> Result<Arc<Supervisor>, RunError> {
        let mut settings = Settings::from_config(app, check_unused);
        // The app's log: what its R prints (through its output hook) and valve's lines about it.
        let log = self.registry.logs.app(&app.name, app.log_buffer);
        if app.is_static() {
            // Its pool stays empty (n_max = 0): ready at once, nothing to launch.
            return Ok(Supervisor::new(
                self.fleet.clone(),
                settings,
                Box::new(NoWorkers),
                self.registry.app(&app.name),
            ));
        }
        let (mut spec, spool) = self.spec(app, site)?;
        spec.library = library.map(Library::paths);
        settings.packages = library.map(|l| l.summary.clone());
        spec.on_output(log);
        let metrics = self.registry.app(&app.name);
        metrics.set_memory_limit(app.memory_limit);
        spec.on_output(metrics.clone());
        settings.spool = Some(spool);
        let warm = self
            .starters
            .zygotes
            .as_ref()
            .filter(|_| !app.preload && app.source.preloadable())
            .map(|z| z.for_r(&app.r_bin));
        let launcher = RLauncher::new(spec, app.preload, warm).map_err(RunError::RunDir)?;
        Ok(Supervisor::new(self.fleet.clone(), settings, Box::new(launcher), metrics))
    }

    /// How app `app`'s R processes are started, in its sandbox: its workers,
    /// and any other R run as the app (a published bundle's package check);
    /// and where its spooled bodies go.
    pub fn spec(&self, app: &AppConfig, site: &Site) -> Result<(Spec, SpoolDir), RunError> {
        let mut spec = Spec::new(
            self.starters.run_dir.clone(),
            app.r_bin.clone(),
            app.source.clone(),
            app.env.clone(),
            self.host.clone(),
            self.port,
        );
        if let Some(hub) = &self.starters.frames {
            spec = spec.over_frames(hub.clone());
        }
        spec.render_timeout = app.start_timeout;
        spec.name = Arc::from(app.name.as_str());
        let sandboxed = |error| RunError::Sandbox { app: app.name.clone(), error };
        let sandbox = Sandbox::for_app(app, site, self.starters.run_dir.path()).map_err(sandboxed)?;
        let spool = SpoolDir { dir: sandbox.run.path().to_path_buf(), owner: sandbox.owner() };
        Ok((spec.sandboxed(sandbox).map_err(sandboxed)?, spool))
    }

    /// Puts the serving apps in the router.
    fn remount(&self, state: &State) {
        let mounted = state
            .serving
            .values()
            .map(|s| Arc::new(Mounted { config: s.config.clone(), sup: s.sup.clone(), older: s.older.clone() }))
            .collect();
        self.router.swap(Table::new(mounted, state.trust.clone()));
    }

    /// The first start: every app is mounted at once (requests wait for their
    /// workers) and its `n_min` workers started; the first failure is returned.
    pub async fn start(self: &Arc<Self>, config: &Config) -> Result<(), RunError> {
        let mut sups = Vec::new();
        let site = Site::of(config);
        let libraries = self.restore_all(config, &site, None).await;
        {
            let mut state = self.lock();
            state.site = Some(site.clone());
            for app in &config.apps {
                let library = match libraries.get(&app.name) {
                    Some(Err(e)) => {
                        // Said in its log and status; the others start.
                        state.failed.insert(app.name.clone(), e.clone());
                        continue;
                    }
                    Some(Ok(l)) => l.as_ref(),
                    None => None,
                };
                let sup = self.generation(app, config.server.check_unused, &site, library)?;
                let print = fingerprint(&app.source);
                state.serving.insert(
                    app.name.clone(),
                    Serving { config: app.clone(), print, sup: sup.clone(), older: Vec::new() },
                );
                sups.push((app.clone(), sup));
            }
            self.remount(&state);
        }
        let mut set = tokio::task::JoinSet::new();
        for (app, sup) in sups {
            set.spawn(async move { sup.start().await.map_err(|e| (app, e)) });
        }
        while let Some(done) = set.join_next().await {
            if let Ok(Err((app, error))) = done {
                return Err(RunError::Start {
                    app: app.name.clone(),
                    path: app.source.path().display().to_string(),
                    error,
                });
            }
        }
        Ok(())
    }

    /// The paths every live generation serves from: serving, starting, and
    /// winding down (a published version in use is never removed).
    pub fn paths_in_use(&self) -> Vec<std::path::PathBuf> {
        let state = self.lock();
        let configs = state.serving.values().map(|s| &s.config).chain(state.starting.values().map(|s| &s.config));
        let mut paths: Vec<std::path::PathBuf> = configs.map(|c| c.source.path().to_path_buf()).collect();
        paths.extend(state.winding.iter().map(|(_, p)| p.clone()));
        paths
    }

    /// Changes each time an old generation stops.
    pub fn generations_ended(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ended.subscribe()
    }

    /// Configured apps that serve no version, and why.
    pub fn not_served(&self) -> Vec<(String, String)> {
        self.lock().failed.iter().map(|(n, e)| (n.clone(), e.clone())).collect()
    }

    /// Current workers of every app, as the ready line and status show them.
    pub fn configs(&self) -> Vec<AppConfig> {
        self.lock().serving.values().map(|s| s.config.clone()).collect()
    }

    /// Applies a new configuration (see the module's comment). Returns at
    /// once: new generations take over when they answer.
    pub async fn reload(self: &Arc<Self>, config: Config) -> Plan {
        let _one = self.reloading.lock().await;
        let prints: Vec<u64> = {
            let sources: Vec<AppSource> = config.apps.iter().map(|a| a.source.clone()).collect();
            tokio::task::spawn_blocking(move || sources.iter().map(fingerprint).collect()).await.unwrap_or_default()
        };
        self.fleet.set_max_workers(config.server.max_workers);
        let libraries = self.restore_all(&config, &Site::of(&config), None).await;
        let mut plan = Plan::default();
        let mut stop = Vec::new();
        let mut retire = Vec::new();
        let mut launch = Vec::new();
        {
            let mut state = self.lock();
            state.check_unused = config.server.check_unused;
            state.grace = config.server.graceful_timeout;
            state.trust = Arc::new(config.server.trust.clone());
            let site = Site::of(&config);
            state.site = Some(site.clone());
            for (app, print) in config.apps.iter().zip(prints.iter().copied().chain(std::iter::repeat(0))) {
                // New allow lists hold for the next request, a new log size at
                // once: they need no new generation.
                if let Some(serving) = state.serving.get_mut(&app.name) {
                    serving.config.allow = app.allow.clone();
                    serving.config.log_buffer = app.log_buffer;
                }
                if let Some(starting) = state.starting.get_mut(&app.name) {
                    starting.config.allow = app.allow.clone();
                    starting.config.log_buffer = app.log_buffer;
                }
                self.registry.logs.app(&app.name, app.log_buffer);
                let same = |c: &AppConfig, p: u64| c.same_workers(app) && p == print;
                if state.serving.get(&app.name).is_some_and(|s| same(&s.config, s.print)) {
                    if let Some(s) = state.starting.remove(&app.name) {
                        stop.push(s.sup);
                        if let Some(serving) = state.serving.get(&app.name) {
                            launch.push((serving.sup.clone(), Some(serving.config.n_min)));
                        }
                    }
                    plan.unchanged.push(app.name.clone());
                    continue;
                }
                if state.serving.contains_key(&app.name) {
                    plan.changed.push(app.name.clone());
                } else {
                    plan.added.push(app.name.clone());
                }
                if state.starting.get(&app.name).is_some_and(|s| same(&s.config, s.print)) {
                    continue;
                }
                if let Some(s) = state.starting.remove(&app.name) {
                    stop.push(s.sup);
                }
                let library = match libraries.get(&app.name) {
                    Some(Err(e)) => Err(e.clone()),
                    Some(Ok(l)) => Ok(l.as_ref()),
                    None => Ok(None),
                };
                let made = library
                    .map_err(RunError::Packages)
                    .and_then(|library| self.generation(app, config.server.check_unused, &site, library));
                let sup = match made {
                    Ok(sup) => sup,
                    Err(e) => {
                        tracing::error!(app = %app.name, error = %e, "cannot start a new generation of the app");
                        if !state.serving.contains_key(&app.name) {
                            state.failed.insert(app.name.clone(), e.to_string());
                        }
                        let path = app.source.path().to_path_buf();
                        let _ =
                            self.promoted.send(Promoted { app: app.name.clone(), path, result: Err(e.to_string()) });
                        continue;
                    }
                };
                state.next += 1;
                let id = state.next;
                state.starting.insert(app.name.clone(), Starting { config: app.clone(), print, sup: sup.clone(), id });
                // The old generation gives up its places as the new one needs them.
                if let Some(old) = state.serving.get(&app.name) {
                    launch.push((old.sup.clone(), Some(0)));
                }
                launch.push((sup, None));
                let this = self.clone();
                let (name, sup) = (app.name.clone(), state.starting[&app.name].sup.clone());
                let (want_min, workers) = (app.n_min, app.n_max > 0);
                self.tasks.spawn(async move {
                    // Proven with one worker at least, even if the app scales to
                    // zero; static content has none to prove.
                    if want_min == 0 && workers {
                        sup.set_n_min(1);
                    }
                    let result = sup.start().await;
                    this.promote(&name, id, want_min, result);
                });
            }
            let wanted: Vec<&str> = config.apps.iter().map(|a| a.name.as_str()).collect();
            // A removed app's log goes with it (its old workers' last lines reach valve's log only).
            self.registry.logs.retain(|name| wanted.contains(&name));
            state.failed.retain(|name, _| wanted.contains(&name.as_str()));
            let gone: Vec<String> = state.serving.keys().filter(|n| !wanted.contains(&n.as_str())).cloned().collect();
            for name in gone {
                if let Some(s) = state.serving.remove(&name) {
                    retire.push((s.sup, Some(s.config.source.path().to_path_buf())));
                    retire.extend(s.older.into_iter().map(|o| (o, None)));
                }
                plan.removed.push(name);
            }
            let gone: Vec<String> = state.starting.keys().filter(|n| !wanted.contains(&n.as_str())).cloned().collect();
            for name in gone {
                if let Some(s) = state.starting.remove(&name) {
                    stop.push(s.sup);
                }
            }
            self.remount(&state);
            let grace = state.grace;
            for (sup, path) in retire {
                self.wind_down(&mut state, sup, path, grace);
            }
        }
        for (sup, n_min) in launch {
            if let Some(n) = n_min {
                sup.set_n_min(n);
            }
        }
        for sup in stop {
            self.tasks.spawn(async move { sup.shutdown().await });
        }
        plan
    }

    /// A new generation answered (or could not start): it takes over, or the
    /// old one keeps serving. Ignored if a later reload replaced it meanwhile.
    fn promote(self: &Arc<Self>, name: &str, id: u64, n_min: usize, result: Result<(), StartError>) {
        let mut state = self.lock();
        if state.starting.get(name).is_none_or(|s| s.id != id) {
            return;
        }
        let Some(new) = state.starting.remove(name) else { return };
        let told = result.as_ref().map(|_| ()).map_err(|e| {
            let mut said = e.to_string();
            for line in e.tail() {
                said.push_str("\n  R: ");
                said.push_str(line);
            }
            said
        });
        let _ = self.promoted.send(Promoted {
            app: name.to_string(),
            path: new.config.source.path().to_path_buf(),
            result: told,
        });
        match result {
            Ok(()) => {
                state.failed.remove(name);
                new.sup.set_n_min(n_min);
                let old = state.serving.remove(name);
                let mut older = Vec::new();
                if let Some(old) = old {
                    older.push(old.sup.clone());
                    older.extend(old.older);
                    old.sup.replaced_by(&new.sup);
                    let path = old.config.source.path().to_path_buf();
                    self.wind_down(&mut state, old.sup, Some(path), OLD_GENERATION_MAX);
                    tracing::info!(
                        app = name,
                        "reloaded: the new version serves; the previous one finishes its requests and sessions"
                    );
                } else {
                    tracing::info!(app = name, path = %new.config.prefix, "app added: it serves");
                }
                state
                    .serving
                    .insert(name.to_string(), Serving { config: new.config, print: new.print, sup: new.sup, older });
                self.remount(&state);
            }
            Err(e) => {
                let serving = state.serving.get(name).map(|s| (s.sup.clone(), s.config.n_min));
                if serving.is_none() {
                    state.failed.insert(name.to_string(), e.to_string());
                }
                tracing::error!(app = name, error = %e, output = ?e.tail(),
                    "the app's new version could not start{}", if serving.is_some() { "; the previous version keeps serving" } else { "; it is not served" });
                drop(state);
                if let Some((old, n_min)) = serving {
                    old.set_n_min(n_min);
                }
                self.tasks.spawn(async move { new.sup.shutdown().await });
            }
        }
    }

    /// Winds an old generation down in the background (its path in use
    /// until it stops), then forgets it.
    fn wind_down(
        self: &Arc<Self>,
        state: &mut State,
        sup: Arc<Supervisor>,
        path: Option<std::path::PathBuf>,
        grace: Duration,
    ) {
        if let Some(path) = path {
            if !state.winding.iter().any(|(o, _)| Arc::ptr_eq(o, &sup)) {
                state.winding.push((sup.clone(), path));
            }
        }
        let this = self.clone();
        self.tasks.spawn(async move {
            sup.wind_down(grace).await;
            let mut state = this.lock();
            for s in state.serving.values_mut() {
                s.older.retain(|o| !Arc::ptr_eq(o, &sup));
            }
            state.winding.retain(|(o, _)| !Arc::ptr_eq(o, &sup));
            this.remount(&state);
            drop(state);
            this.ended.send_modify(|n| *n += 1);
        });
    }

    /// Stops every generation (at exit) and waits for their workers.
    pub async fn shutdown(&self) {
        let sups: Vec<Arc<Supervisor>> = {
            let state = self.lock();
            state
                .serving
                .values()
                .flat_map(|s| std::iter::once(s.sup.clone()).chain(s.older.iter().cloned()))
                .chain(state.starting.values().map(|s| s.sup.clone()))
                .collect()
        };
        let mut set = tokio::task::JoinSet::new();
        for sup in sups {
            set.spawn(async move { sup.shutdown().await });
        }
        while set.join_next().await.is_some() {}
        self.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.tasks.wait()).await;
        if let Some(z) = &self.starters.zygotes {
            z.shutdown().await;
        }
    }
}
