//! Where the configuration comes from (`-f`, `--config`, `--site`), read
//! again on every reload.

use std::path::PathBuf;

use super::error::ConfigError;
use super::file;
use super::flags::Args;
use super::model::Config;
use super::problems::Problems;
use super::publish::Candidate;

/// Where the configuration comes from, so that a reload reads it again.
#[derive(Clone, Debug)]
pub enum Source {
    /// `-f`: one app, from flags (a reload restarts its workers).
    Flags(Args),
    /// `--config FILE`.
    File(PathBuf, Args),
    /// `--site DIR`.
    Site(PathBuf, Args),
}

impl Source {
    /// Reads the configuration (again).
    pub fn load(&self) -> Result<Config, LoadError> {
        self.load_with(None)
    }

    /// Reads the configuration as it would be with one published app at
    /// `candidate`'s version (`None`: as its records say).
    pub fn load_with(&self, candidate: Option<&Candidate>) -> Result<Config, LoadError> {
        match self {
            Source::Flags(args) => args.single_with(candidate).map_err(LoadError::Flags),
            Source::File(path, args) => match candidate {
                None => file::load(path, args),
                Some(_) => file::load_with(path, args, candidate),
            }
            .map_err(LoadError::File),
            Source::Site(dir, args) => args.site_with(dir, candidate).map_err(LoadError::Flags),
        }
    }

    /// What a reload reads, for messages.
    pub fn describe(&self) -> String {
        match self {
            Source::Flags(args) => format!("-f {}", args.file.display()),
            Source::File(path, _) => path.display().to_string(),
            Source::Site(dir, _) => format!("--site {}", dir.display()),
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}")]
    Flags(#[from] ConfigError),
    #[error("{0}")]
    File(Problems),
}

impl Args {
    /// Where the configuration comes from: `--config`, `--site` or the flags alone.
    /// Two of `-f`, `--config` and `--site` given the same way (both on the
    /// command line, or both by `VALVE_*` variables) are an error; one on the
    /// command line beats one from a variable (the image's `VALVE_FILE=/app`
    /// yields to `docker run IMAGE --config FILE`).
    pub fn source(&self) -> Result<Source, ConfigError> {
        let cli = |id: &str| self.on_command_line.contains(id);
        let many = self.config.is_some() || self.site.is_some();
        if !self.explicit.contains("file") || !many {
            return Ok(self.clone().source_without_file_conflict());
        }
        let many_on_cli = cli("config") || cli("site");
        match (cli("file"), many_on_cli) {
            (true, false) => Ok(Source::Flags(Args { config: None, site: None, ..self.clone() })),
            (false, true) => {
                let mut args = self.clone();
                args.explicit.remove("file");
                Ok(args.source_without_file_conflict())
            }
            _ => Err(ConfigError::Several),
        }
    }

    fn source_without_file_conflict(self) -> Source {
        match (&self.config, &self.site) {
            (Some(path), _) => Source::File(path.clone(), self.clone()),
            (None, Some(dir)) => Source::Site(dir.clone(), self.clone()),
            (None, None) => Source::Flags(self),
        }
    }
}
