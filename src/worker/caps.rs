//! What a process valve starts as root keeps of root's capabilities.
//!
//! The warm parent forks into apps' users: each fork enters the app's
//! sandbox (a mount namespace and its view, then the app's groups, gid and
//! uid) before it reads any of the app's files. That needs CAP_SETUID and
//! CAP_SETGID; where apps get a private view also CAP_SYS_ADMIN (mounts)
//! and CAP_DAC_READ_SEARCH (a cover goes over a hidden path inside folders
//! root does not own, such as the package cache's); nothing else of root's
//! (writing any file, owning any file, signals, ptrace, raw sockets,
//! modules, devices). So
//! the warm parent is started with only those in its bounding set (and
//! none inheritable or ambient): root's exec gives it no more than the
//! bounding set, its forks lose them all when they become the app's user.
//!
//! Dropping from the bounding set needs CAP_SETPCAP; a valve without it (a
//! container that took it away) cannot narrow the warm parent's rights and
//! says so once at start.

use std::io;

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;
const CAP_SETPCAP: u32 = 8;
const CAP_SYS_ADMIN: u32 = 21;

/// The rights a parent of forks into apps' users needs.
const FORKS_INTO_USERS: [u32; 2] = [CAP_SETUID, CAP_SETGID];
/// And where it makes private views (valve has CAP_SYS_ADMIN).
const VIEWS: [u32; 2] = [CAP_SYS_ADMIN, CAP_DAC_READ_SEARCH];

/// The highest capability this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40)
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// A set of capabilities to keep, applied between fork and exec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    mask: u64,
    last_cap: u32,
}

/// A capability set line of /proc/PID/status (`CapEff:\t000001ffffffffff`).
pub fn status_set(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    u64::from_str_radix(line[field.len() + 1..].trim(), 16).ok()
}

impl Keep {
    /// Of `have` (valve's effective set), what a parent of forks into apps'
    /// users keeps.
    pub fn forks_into_users(have: u64, last_cap: u32) -> Keep {
        let bits = |caps: &[u32]| caps.iter().fold(0u64, |m, c| m | (1u64 << c));
        let mut wanted = bits(&FORKS_INTO_USERS);
        if have & (1u64 << CAP_SYS_ADMIN) != 0 {
            wanted |= bits(&VIEWS);
        }
        Keep { mask: have & wanted, last_cap }
    }

    /// For a warm parent of this valve: `None` when valve is not root (its
    /// children have no capabilities anyway), `Err` when it is root but may
    /// not narrow the bounding set (no CAP_SETPCAP).
    pub fn for_warm_parent() -> Result<Option<Keep>, String> {
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        let status = std::fs::read_to_string("/proc/self/status").map_err(|e| format!("/proc/self/status: {e}"))?;
        let have = status_set(&status, "CapEff").ok_or("/proc/self/status has no CapEff line")?;
        if have & (1u64 << CAP_SETPCAP) == 0 {
            return Err("valve lacks CAP_SETPCAP".into());
        }
        Ok(Some(Keep::forks_into_users(have, last_cap())))
    }

    /// The kept capabilities as a mask (what the spawner is asked to keep).
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// `mask` of this kernel's capabilities (the spawner's side of `mask`).
    pub fn of_mask(mask: u64) -> Keep {
        Keep { mask, last_cap: last_cap() }
    }

    /// Between fork and exec (async-signal-safe: raw system calls only):
    /// every other capability out of the bounding set, none ambient, and
    /// inheritable, permitted and effective narrowed to the kept ones.
    pub fn apply(&self) -> io::Result<()> {
        for cap in 0..=self.last_cap.min(63) {
            if self.mask & (1u64 << cap) != 0 {
                continue;
            }
            // SAFETY: plain prctl calls on this process.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
                let e = io::Error::last_os_error();
                // A capability this kernel does not know.
                if e.raw_os_error() != Some(libc::EINVAL) {
                    return Err(e);
                }
            }
        }
        // SAFETY: as above.
        unsafe { libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0) };
        let low = self.mask as u32;
        let high = (self.mask >> 32) as u32;
        let mut header = Header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let data = [
            Data { effective: low, permitted: low, inheritable: 0 },
            Data { effective: high, permitted: high, inheritable: 0 },
        ];
        // SAFETY: capset with a version-3 header and its two data words.
        if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of the capabilities in `mask`, as people read them.
    fn names(mask: u64) -> Vec<String> {
        const KNOWN: [(u32, &str); 5] = [
            (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
            (CAP_SETGID, "CAP_SETGID"),
            (CAP_SETUID, "CAP_SETUID"),
            (CAP_SETPCAP, "CAP_SETPCAP"),
            (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        ];
        (0..64)
            .filter(|c| mask & (1u64 << c) != 0)
            .map(|c| {
                KNOWN.iter().find(|(k, _)| *k == c).map_or_else(|| format!("capability {c}"), |(_, n)| n.to_string())
            })
            .collect()
    }

    #[test]
    fn a_parent_of_forks_keeps_only_switching_users_and_views_of_what_valve_has() {
        let all = (1u64 << 41) - 1;
        let keep = Keep::forks_into_users(all, 40);
        assert_eq!(names(keep.mask), ["CAP_DAC_READ_SEARCH", "CAP_SETGID", "CAP_SETUID", "CAP_SYS_ADMIN"]);
        // Without CAP_SYS_ADMIN (no private views), neither it nor reading
        // past permissions is kept.
        let keep = Keep::forks_into_users(all & !(1u64 << CAP_SYS_ADMIN), 40);
        assert_eq!(names(keep.mask), ["CAP_SETGID", "CAP_SETUID"]);
    }

    #[test]
    fn status_sets_are_read_by_their_field() {
        let status = "Name:\tR\nCapInh:\t0000000000000000\nCapPrm:\t00000000002000c0\nCapEff:\t00000000002000c0\n";
        assert_eq!(status_set(status, "CapEff"), Some(0x2000c0));
        assert_eq!(status_set(status, "CapInh"), Some(0));
        assert_eq!(status_set(status, "CapBnd"), None);
        assert_eq!(names(0x2000c0), ["CAP_SETGID", "CAP_SETUID", "CAP_SYS_ADMIN"]);
    }
}
