//! The package restores' counters (`valve_package_*`): valve-wide, since the
//! package cache is shared by every app.

use std::fmt::Write;

use super::family::header;

pub(super) fn render(out: &mut String) {
    let c = crate::restore::counts::counts();
    header(
        out,
        "valve_package_restores_total",
        "counter",
        "Restores of apps' packages into their own libraries, by result (hit: the whole library was in the cache).",
    );
    let _ = writeln!(out, "valve_package_restores_total{{result=\"restored\"}} {}", c.restored - c.library_hits);
    let _ = writeln!(out, "valve_package_restores_total{{result=\"hit\"}} {}", c.library_hits);
    let _ = writeln!(out, "valve_package_restores_total{{result=\"failed\"}} {}", c.failed);
    header(out, "valve_packages_placed_total", "counter", "Packages placed in apps' libraries, by where they came from (r_library: the server's R held that version; cache: built before; built: built now).");
    let _ = writeln!(out, "valve_packages_placed_total{{source=\"r_library\"}} {}", c.from_r);
    let _ = writeln!(out, "valve_packages_placed_total{{source=\"cache\"}} {}", c.from_cache);
    let _ = writeln!(out, "valve_packages_placed_total{{source=\"built\"}} {}", c.built);
    header(
        out,
        "valve_package_build_seconds_total",
        "counter",
        "Seconds spent building packages from source for apps' libraries.",
    );
    let _ = writeln!(out, "valve_package_build_seconds_total {:.3}", c.build_seconds);
}
