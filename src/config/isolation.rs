//! How valve keeps apps apart (`Isolation`), decided from what the kernel
//! lets it do (`Kernel`, measured by the worker module) and the
//! `isolation` setting; under Landlock, what the kernel's ABI covers
//! (`LandlockCoverage`), as start-up, status and `--check` say it.

use super::users::Kernel;

/// The isolation valve gives every app, as its status and `--check` say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Each app its own user and a private view of the files (valve runs as
    /// root and may make mount namespaces).
    View,
    /// Each app its own user; files are hidden only by their permissions
    /// (root without mount namespaces, as in a container without CAP_SYS_ADMIN).
    Users,
    /// Every app runs as valve's own user, each under a Landlock ruleset
    /// of its own (valve is not root; the kernel's Landlock ABI).
    Landlock(u32),
    /// Every app runs as valve's own user (valve is not root).
    Shared,
}

/// What an app under a ruleset of `abi` is kept from, and what it is not:
/// said at start, in status and by `valve --check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandlockCoverage {
    pub abi: u32,
    pub protected: Vec<&'static str>,
    pub unprotected: Vec<&'static str>,
}

impl LandlockCoverage {
    pub fn of(abi: u32) -> LandlockCoverage {
        let mut protected = vec![
            "other apps' folders and valve's files (read and write)",
            "other processes' memory and environment (ptrace, /proc/PID/mem)",
        ];
        let mut unprotected = Vec::new();
        let mut by = |ok: bool, what: &'static str| if ok { protected.push(what) } else { unprotected.push(what) };
        by(abi >= 3, "truncating another app's file by its path (ABI 3)");
        by(abi >= 6, "signals to valve and other apps' workers (ABI 6)");
        by(abi >= 6, "other apps' abstract Unix sockets (ABI 6)");
        // Never covered on this ABI range: said so, not claimed.
        unprotected.push("connecting to another app's pathname Unix socket (Landlock covers it from Linux 7.1)");
        unprotected.push("TCP and UDP (an app may connect anywhere, as any program of valve's user)");
        LandlockCoverage { abi, protected, unprotected }
    }

    /// Whether every protection valve asks of Landlock holds (ABI 6 and later).
    pub fn full(&self) -> bool {
        self.abi >= 6
    }

    /// One line for logs and `--check`.
    pub fn describe(&self) -> String {
        format!(
            "Landlock ABI {}: kept from {}; not kept from {}",
            self.abi,
            self.protected.join(", "),
            self.unprotected.join(", ")
        )
    }
}

/// `isolation`: what valve without root does to keep apps apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IsolationSetting {
    /// The most the kernel allows: Landlock where it has it, whatever its ABI.
    #[default]
    Auto,
    /// Apps kept apart in full (their own users, or Landlock ABI 6 or later), or valve does not start.
    Required,
    /// Without root, no Landlock: every app's R reaches what valve's user may.
    None,
}

impl IsolationSetting {
    pub fn parse(value: &str) -> Result<IsolationSetting, String> {
        match value.trim() {
            "auto" => Ok(IsolationSetting::Auto),
            "required" => Ok(IsolationSetting::Required),
            "none" => Ok(IsolationSetting::None),
            other => Err(format!("{other:?}: use \"auto\", \"required\" or \"none\"")),
        }
    }
}

impl Isolation {
    /// What the kernel allows with root's levels first (users of their own).
    pub fn from_kernel(k: &Kernel) -> Isolation {
        match (k.switch_users, k.mount_namespaces) {
            (true, true) => Isolation::View,
            (true, false) => Isolation::Users,
            (false, _) if k.landlock >= 1 => Isolation::Landlock(k.landlock),
            (false, _) => Isolation::Shared,
        }
    }

    /// The level `setting` asks for on kernel `k`, or why valve must not start.
    pub fn decide(k: &Kernel, setting: IsolationSetting) -> Result<Isolation, String> {
        let level = match (Isolation::from_kernel(k), setting) {
            (Isolation::Landlock(_), IsolationSetting::None) => Isolation::Shared,
            (level, _) => level,
        };
        if setting != IsolationSetting::Required {
            return Ok(level);
        }
        match level {
            Isolation::View | Isolation::Users => Ok(level),
            Isolation::Landlock(abi) if abi >= 6 => Ok(level),
            Isolation::Landlock(abi) => Err(format!(
                "isolation = \"required\", but valve (uid {}) cannot switch users and this kernel's Landlock is ABI {abi}, which cannot keep apps from signalling each other and valve (ABI 6, Linux 6.12, can): run valve as root, on a newer kernel, or set isolation = \"auto\" to serve with what this kernel gives",
                k.uid
            )),
            _ => Err(format!(
                "isolation = \"required\", but valve (uid {}) cannot switch users and the kernel offers no Landlock (a kernel without it, booted without `lsm=...landlock`, or a runtime such as gVisor): run valve as root, on a kernel with Landlock, or set isolation = \"auto\" to let every app's R run as valve's user",
                k.uid
            )),
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Isolation::View => "own user, private view",
            Isolation::Users => "own user",
            Isolation::Landlock(_) => "valve's user, Landlock",
            Isolation::Shared => "shared with valve",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_kernel() -> Kernel {
        Kernel { uid: 0, gid: 0, switch_users: true, mount_namespaces: true, landlock: 7 }
    }

    #[test]
    fn without_root_landlock_is_the_default_and_required_refuses_less() {
        let at = |landlock| Kernel { uid: 1000, gid: 1000, switch_users: false, mount_namespaces: false, landlock };
        use IsolationSetting::*;
        assert_eq!(Isolation::decide(&at(7), Auto), Ok(Isolation::Landlock(7)));
        assert_eq!(Isolation::decide(&at(3), Auto), Ok(Isolation::Landlock(3)), "partial, said at start");
        assert_eq!(Isolation::decide(&at(7), None), Ok(Isolation::Shared));
        assert_eq!(Isolation::decide(&at(0), Auto), Ok(Isolation::Shared));
        assert_eq!(Isolation::decide(&at(6), Required), Ok(Isolation::Landlock(6)));
        let old = Isolation::decide(&at(5), Required).unwrap_err();
        assert!(old.contains("ABI 5") && old.contains("signalling"), "{old}");
        let none = Isolation::decide(&at(0), Required).unwrap_err();
        assert!(none.contains("no Landlock") && none.contains("uid 1000"), "{none}");
        assert_eq!(Isolation::decide(&root_kernel(), Required), Ok(Isolation::View), "root's levels are more");
        assert_eq!(Isolation::decide(&root_kernel(), None), Ok(Isolation::View), "none only turns Landlock off");
        assert!(IsolationSetting::parse("strict").unwrap_err().contains("\"required\""));
        assert!(LandlockCoverage::of(7).full());
        let old = LandlockCoverage::of(3);
        assert!(!old.full());
        assert!(old.describe().contains("not kept from signals to valve"), "{}", old.describe());
        assert!(LandlockCoverage::of(7).describe().contains("pathname Unix socket"), "what no ABI here covers is said");
    }
}
