# valve's own pages, read through a handle: /__valve__/status and the
# Prometheus metrics, on valve's admin address (the main one unless valve has
# a separate admin listener). Every one of them asks who is calling: the
# handle sends valve's operator token, read from the file valve's ready line
# names (`admin_token_file`, in valve's state folder; never printed).

http_get <- function(url, timeout = 10, token_file = NULL) {
  h <- curl::new_handle(timeout = timeout, connecttimeout = timeout)
  if (!is.null(token_file) && !is.na(token_file)) {
    token <- trimws(paste(readLines(token_file, warn = FALSE), collapse = ""))
    curl::handle_setheaders(h, Authorization = paste("Bearer", token))
  }
  res <- curl::curl_fetch_memory(url, handle = h)
  list(status = res$status_code, body = rawToChar(res$content))
}

valve_get_status <- function(admin_url, timeout = 10, token_file = NULL) {
  url <- paste0(admin_url, "/__valve__/status")
  res <- http_get(url, timeout, token_file)
  if (res$status != 200L) {
    cli::cli_abort("valve answered {res$status} for {.url {url}}.", call = NULL)
  }
  jsonlite::fromJSON(res$body, simplifyVector = TRUE)
}

# The metrics as valve prints them (raw = TRUE), or one row per sample.
valve_get_metrics <- function(admin_url, raw = FALSE, timeout = 10, token_file = NULL) {
  res <- NULL
  for (path in c("/__valve__/metrics", "/metrics")) {
    res <- http_get(paste0(admin_url, path), timeout, token_file)
    if (res$status == 200L) break
  }
  if (res$status != 200L) {
    cli::cli_abort("valve answered {res$status} for its metrics at {.url {admin_url}}.", call = NULL)
  }
  if (isTRUE(raw)) {
    return(res$body)
  }
  parse_metrics(res$body)
}

# Prometheus text format: `name{label="value",...} number` per sample.
parse_metrics <- function(text) {
  lines <- strsplit(text, "\n", fixed = TRUE)[[1]]
  lines <- lines[nzchar(trimws(lines)) & !startsWith(lines, "#")]
  m <- regmatches(lines, regexec("^([A-Za-z_:][A-Za-z0-9_:]*)(\\{(.*)\\})?[[:space:]]+([^[:space:]]+)", lines))
  m <- m[lengths(m) > 0]
  data.frame(
    name = vapply(m, `[[`, "", 2),
    labels = vapply(m, `[[`, "", 4),
    value = suppressWarnings(as.numeric(vapply(m, `[[`, "", 5))),
    stringsAsFactors = FALSE
  )
}
