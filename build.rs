//! Builds the C executor the warm parent's forks enter an app's sandbox with
//! (src/worker/zygote/enter.c) as a shared object R loads with dyn.load();
//! valve carries it inside its binary, as it carries its R files.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "src/worker/zygote/enter.c";
    println!("cargo:rerun-if-changed={source}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("valve_enter.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-pthread", "-O2", "-s", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(source)
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run the C compiler `{cc}` ({e}): install gcc (apt-get install gcc) or set CC")
        });
    assert!(status.success(), "the C compiler `{cc}` failed on {source} ({status})");
}
