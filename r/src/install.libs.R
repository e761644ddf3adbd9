# R CMD INSTALL runs this instead of installing a shared library: valve is a
# program, installed as bin/valve (system.file("bin", "valve", package = "valve")).
binary <- "valve-binary"
if (file.exists(binary)) {
  dest <- file.path(R_PACKAGE_DIR, "bin")
  dir.create(dest, recursive = TRUE, showWarnings = FALSE)
  target <- file.path(dest, "valve")
  if (!file.copy(binary, target, overwrite = TRUE)) {
    stop("could not copy the valve binary to ", target)
  }
  Sys.chmod(target, "755")
  message("valve: installed the valve binary (", format(structure(file.size(target), class = "object_size"), units = "auto"), ")")
} else {
  message("valve: no valve binary in this installation; valve_binary() will look in ",
          "options(valve.binary = ), VALVE_BINARY and the PATH.")
}
