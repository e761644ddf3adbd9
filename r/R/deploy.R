# Publishing an app to a running valve without rsconnect: the bundle (the
# app's files and a manifest.json naming its kind and packages) and the same
# calls of valve's publishing API (its v1 calls) that rsconnect 1.x makes.

#' Publish an app to a valve server
#'
#' Bundles `appDir` (its files and a `manifest.json` naming the app's kind
#' and the packages it loads, with their versions) and publishes it to
#' `server`, a valve started with `--publish-dir` and `--publish-keys-file`,
#' as `rsconnect::deployApp()` does: the upload becomes the app's next
#' version, valve checks the packages against what the app's R loads, starts
#' the new version beside the one serving and switches once it answers. Each
#' step valve takes is printed as it comes.
#'
#' @param appDir The app's folder: a plumber API (`plumber.R` or
#'   `entrypoint.R`), a Shiny app (`app.R` or `server.R`), an interactive R
#'   Markdown document (`runtime: shiny`), or static content (`index.html`).
#'   A `manifest.json` already in it (`rsconnect::writeManifest()`) is used as
#'   it is.
#' @param server valve's publishing address: its admin address (the
#'   `admin_url` of its ready line, `valve_start()`'s handle) or its
#'   `--publish-addr`, such as `"http://127.0.0.1:9090"`.
#' @param key A publishing key (`valve publish-key NAME` makes one). Default:
#'   the `VALVE_PUBLISH_KEY` environment variable.
#' @param name The app's name, and so its path (`/<name>/`).
#' @param title A title for people.
#' @param allow_users,allow_groups Who may use the app (as `allow_users` and
#'   `allow_groups` in valve's configuration); `NULL` leaves them as they are.
#' @param quiet Print nothing but errors.
#' @return Invisibly, a list: `url` (where the app answers), `name`,
#'   `version` (the version valve made of this upload) and `guid`.
#' @export
#' @examples
#' \dontrun{
#' valve_deploy("my-api", "http://127.0.0.1:9090", key = Sys.getenv("VALVE_PUBLISH_KEY"))
#' }
valve_deploy <- function(appDir = ".", server, key = Sys.getenv("VALVE_PUBLISH_KEY"),
                         name = basename(normalizePath(appDir, mustWork = FALSE)), title = name,
                         allow_users = NULL, allow_groups = NULL, quiet = FALSE) {
  call <- rlang::current_env()
  if (!dir.exists(appDir)) {
    cli::cli_abort("{.arg appDir} must be an app's folder: {.path {appDir}} is none.", call = call)
  }
  if (!is.character(server) || length(server) != 1 || !grepl("^https?://", server)) {
    cli::cli_abort(c(
      "{.arg server} must be valve's publishing address, such as {.val http://127.0.0.1:9090}.",
      "i" = "It is valve's admin address (the {.field admin_url} of {.fn valve_start}'s handle) or its {.code --publish-addr}."
    ), call = call)
  }
  if (!is.character(key) || length(key) != 1 || !nzchar(key)) {
    cli::cli_abort(c(
      "{.arg key} must be a publishing key.",
      "i" = "Make one on the server with {.code valve publish-key NAME}, or set {.envvar VALVE_PUBLISH_KEY}."
    ), call = call)
  }
  say <- function(...) if (!isTRUE(quiet)) cli::cli_text(...)
  api <- paste0(sub("/+$", "", server), "/__api__")
  bundle <- deploy_bundle(appDir, call)
  on.exit(unlink(bundle), add = TRUE)
  found <- deploy_call(api, key, "GET", paste0("/v1/content?name=", utils::URLencode(name, reserved = TRUE)), call = call)
  access <- list(allow_users = as.list(allow_users), allow_groups = as.list(allow_groups))
  access <- access[c(!is.null(allow_users), !is.null(allow_groups))]
  if (length(found) == 0) {
    content <- deploy_call(api, key, "POST", "/v1/content", c(list(name = name, title = title), access), call = call)
    say("Created {.val {name}} on {.url {server}}")
  } else {
    content <- found[[1]]
    if (length(access) > 0) {
      content <- deploy_call(api, key, "PATCH", paste0("/v1/content/", content$guid), access, call = call)
    }
  }
  guid <- content$guid
  say("Uploading the bundle ({file.size(bundle)} bytes)")
  uploaded <- deploy_call(api, key, "POST", paste0("/v1/content/", guid, "/bundles"), file = bundle, call = call)
  task <- deploy_call(api, key, "POST", paste0("/v1/content/", guid, "/deploy"), list(bundle_id = uploaded$id), call = call)
  first <- 0
  repeat {
    t <- deploy_call(api, key, "GET", sprintf("/v1/tasks/%s?first=%d&wait=1", task$task_id, first), call = call)
    for (line in unlist(t$output)) if (!isTRUE(quiet)) cli::cat_line(line)
    first <- t$last
    if (isTRUE(t$finished)) break
  }
  if (!identical(as.integer(t$code), 0L)) {
    cli::cli_abort(c("valve did not deploy {.val {name}}.", "x" = "{t$error}"), call = call)
  }
  say("{.val {name}} version {uploaded$id} serves at {.url {content$content_url}}")
  invisible(list(url = content$content_url, name = name, version = as.integer(uploaded$id), guid = guid))
}

# One call of the publishing API: the parsed JSON answer, or an error naming
# the call and valve's message.
deploy_call <- function(api, key, method, path, body = NULL, file = NULL, call = rlang::caller_env()) {
  h <- curl::new_handle(timeout = 600, connecttimeout = 20, customrequest = method)
  headers <- list(Authorization = paste("Key", key))
  if (!is.null(file)) {
    size <- file.size(file)
    curl::handle_setopt(h, post = TRUE, postfieldsize_large = size,
                        postfields = readBin(file, "raw", n = size))
    headers[["Content-Type"]] <- "application/x-tar"
  } else if (!is.null(body)) {
    curl::handle_setopt(h, postfields = jsonlite::toJSON(body, auto_unbox = TRUE, null = "null"))
    headers[["Content-Type"]] <- "application/json"
  }
  curl::handle_setheaders(h, .list = headers)
  res <- tryCatch(
    curl::curl_fetch_memory(paste0(api, path), handle = h),
    error = function(e) cli::cli_abort(c("Cannot reach valve at {.url {api}}.", "x" = conditionMessage(e)), call = call)
  )
  text <- rawToChar(res$content)
  json <- tryCatch(jsonlite::fromJSON(text, simplifyVector = FALSE), error = function(e) NULL)
  if (res$status_code >= 300) {
    why <- if (is.list(json) && !is.null(json$error)) json$error else text
    cli::cli_abort(c("valve answered {res$status_code} to {method} {path}.", "x" = "{why}"), call = call)
  }
  json
}

# The app's kind, as the manifest's `metadata.appmode` names it.
deploy_appmode <- function(dir) {
  files <- list.files(dir)
  has <- function(f) any(tolower(files) == f)
  if (has("entrypoint.r") || has("plumber.r")) return("api")
  if (has("app.r") || has("server.r")) return("shiny")
  docs <- files[grepl("\\.[Rq]md$", files, ignore.case = TRUE)]
  for (doc in docs) {
    head <- readLines(file.path(dir, doc), n = 50, warn = FALSE)
    if (any(grepl("^\\s*runtime:\\s*shiny", head))) return("rmd-shiny")
  }
  if (has("index.html")) return("static")
  cli::cli_abort(c(
    "{.path {dir}} holds no app valve publishes.",
    "i" = "A plumber API ({.file plumber.R}), a Shiny app ({.file app.R}), an interactive document ({.code runtime: shiny}) or static content ({.file index.html})."
  ), call = NULL)
}

# The packages the app's R code loads, and everything they load, as
# installed here: name and version, as a manifest lists them.
deploy_packages <- function(dir) {
  code <- list.files(dir, pattern = "\\.(R|r|Rmd|rmd|qmd)$", recursive = TRUE, full.names = TRUE)
  text <- unlist(lapply(code, readLines, warn = FALSE))
  direct <- c(
    unlist(regmatches(text, gregexpr("(?<=library\\(|require\\()[\"']?[A-Za-z][A-Za-z0-9.]*", text, perl = TRUE))),
    unlist(regmatches(text, gregexpr("[A-Za-z][A-Za-z0-9.]*(?=::)", text, perl = TRUE)))
  )
  direct <- unique(gsub("[\"']", "", direct))
  installed <- utils::installed.packages()
  direct <- direct[direct %in% rownames(installed)]
  deps <- tools::package_dependencies(direct, db = installed, recursive = TRUE,
                                      which = c("Depends", "Imports", "LinkingTo"))
  all <- unique(c(direct, unlist(deps)))
  base <- rownames(installed)[installed[, "Priority"] %in% "base"]
  all <- sort(setdiff(all[all %in% rownames(installed)], c(base, "R")))
  out <- lapply(all, function(p) {
    list(Source = "local", description = list(Package = p, Version = installed[p, "Version"]))
  })
  names(out) <- all
  out
}

# The bundle: the app's files (not rsconnect's records, version control, or
# an renv library, which belongs on the server) and a manifest.json, as a
# gzipped tar in a temporary file.
deploy_bundle <- function(dir, call) {
  dir <- normalizePath(dir)
  stage <- tempfile("valve-bundle-")
  dir.create(stage)
  on.exit(unlink(stage, recursive = TRUE), add = TRUE)
  files <- list.files(dir, recursive = TRUE, all.files = TRUE, no.. = TRUE)
  skip <- "^(rsconnect|\\.git|\\.Rproj\\.user|renv/library|packrat/lib[^/]*)(/|$)"
  files <- files[!grepl(skip, files)]
  for (f in files) {
    dir.create(file.path(stage, dirname(f)), recursive = TRUE, showWarnings = FALSE)
    file.copy(file.path(dir, f), file.path(stage, f), copy.date = TRUE)
  }
  if (!file.exists(file.path(stage, "manifest.json"))) {
    manifest <- list(
      version = 1,
      metadata = list(appmode = deploy_appmode(stage)),
      packages = deploy_packages(stage),
      files = lapply(files, function(f) list(checksum = unname(tools::md5sum(file.path(stage, f)))))
    )
    names(manifest$files) <- files
    writeLines(jsonlite::toJSON(manifest, auto_unbox = TRUE, pretty = TRUE), file.path(stage, "manifest.json"))
  }
  bundle <- tempfile("valve-bundle-", fileext = ".tar.gz")
  old <- setwd(stage)
  on.exit(setwd(old), add = TRUE, after = FALSE)
  utils::tar(bundle, files = list.files(".", all.files = TRUE, no.. = TRUE), compression = "gzip", tar = "internal")
  bundle
}
