//! A plain plumber process, what valve is compared against, and what the
//! kernel's TCP table says about a port (backlogs, unread bytes).

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, need_r_packages, START_DEADLINE};

/// A plain plumber process on a TCP port: what valve is compared against.
pub struct Plumber {
    child: Child,
    pub url: String,
}

impl Plumber {
    /// `target` is a plumber file, or a directory for `plumb(dir = )`.
    pub fn start(target: &Path) -> Plumber {
        need_r_packages(&["plumber"]);
        // A port from `free_port` is free only until R binds it, and tests run in
        // parallel: a valve started meanwhile may take it. So the port counts only
        // once this very process listens on it; otherwise try another.
        for _ in 0..5 {
            let port = free_port();
            let expr = if target.is_dir() {
                format!("library(plumber); pr_run(plumb(dir = '{}'), port = {port}, quiet = TRUE)", target.display())
            } else {
                format!("library(plumber); pr_run(pr('{}'), port = {port}, quiet = TRUE)", target.display())
            };
            let workdir = if target.is_dir() { target.to_path_buf() } else { target.parent().unwrap().to_path_buf() };
            let mut child = Command::new("Rscript")
                .args(["-e", &expr])
                .current_dir(workdir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .process_group(0)
                .spawn()
                .expect("Rscript starts");
            let start = Instant::now();
            while start.elapsed() < START_DEADLINE {
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if listens_on(child.id(), port) {
                    return Plumber { child, url: format!("http://127.0.0.1:{port}") };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
        panic!("plain plumber could not listen on a free port for {}", target.display());
    }
}

/// One TCP socket of this machine, as /proc/net/tcp and tcp6 show it.
struct TcpRow {
    local_port: u16,
    remote_port: u16,
    listening: bool,
    /// Bytes received and not yet read; for a listening socket, connections not yet accepted.
    rx_queue: u64,
    inode: String,
}

fn tcp_table() -> Vec<TcpRow> {
    let port = |col: Option<&&str>| col?.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let mut rows = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(table) = std::fs::read_to_string(file) else { continue };
        // Columns: sl local_address rem_address st tx_queue:rx_queue tr retrnsmt uid timeout inode.
        rows.extend(table.lines().skip(1).filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            Some(TcpRow {
                local_port: port(cols.get(1))?,
                remote_port: port(cols.get(2))?,
                listening: cols.get(3) == Some(&"0A"),
                rx_queue: u64::from_str_radix(cols.get(4)?.split(':').nth(1)?, 16).ok()?,
                inode: cols.get(9)?.to_string(),
            })
        }));
    }
    rows
}

/// How many connections wait to be accepted on the listening socket at `port`.
pub fn accept_backlog(port: u16) -> Option<u64> {
    tcp_table().into_iter().find(|r| r.listening && r.local_port == port).map(|r| r.rx_queue)
}

/// How many bytes a client (at `client_port`) sent that the server side at
/// `server_port` has not read yet; `None` while no such connection exists.
pub fn unread_by_server(server_port: u16, client_port: u16) -> Option<u64> {
    tcp_table()
        .into_iter()
        .find(|r| !r.listening && r.local_port == server_port && r.remote_port == client_port)
        .map(|r| r.rx_queue)
}

/// Whether process `pid` holds the listening TCP socket on 127.0.0.1 or any address at `port`.
fn listens_on(pid: u32, port: u16) -> bool {
    let inodes: Vec<String> = tcp_table()
        .into_iter()
        .filter(|r| r.listening && r.local_port == port)
        .map(|r| format!("socket:[{}]", r.inode))
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.filter_map(Result::ok)
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .any(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
}

impl Drop for Plumber {
    fn drop(&mut self) {
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}
