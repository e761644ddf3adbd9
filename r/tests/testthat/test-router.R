# A plumber router built in the session (R/router.R): what travels with it,
# what cannot cross to a worker, and three workers serving it.

skip_if_not_installed("plumber")

test_that("objects a handler uses from the global environment travel with the router", {
  # As if typed at the console: the handler and its helper live in the global
  # environment, which saveRDS() does not copy.
  withr::defer(rm(list = intersect(c("factor", "helper"), ls(globalenv())), envir = globalenv()))
  assign("factor", 3, envir = globalenv())
  assign("helper", eval(quote(function(x) x * factor), globalenv()), envir = globalenv())
  handler <- eval(quote(function(n = 1) helper(as.numeric(n))), globalenv())
  router <- plumber::pr() |> plumber::pr_get("/x", handler)

  expect_message(path <- valve:::save_router(router), "Copied to valve's workers")
  withr::defer(unlink(dirname(path), recursive = TRUE))
  # Private: only this user can read the directory and the file. As root,
  # readable by the user of its own valve gives the app, outside this
  # session's temporary folder (0700, which another user cannot pass).
  if (valve:::is_root()) {
    expect_equal(format(file.info(dirname(path))$mode), "755")
    expect_equal(format(file.info(path)$mode), "644")
    expect_equal(dirname(dirname(path)), dirname(tempdir()))
  } else {
    expect_equal(format(file.info(dirname(path))$mode), "700")
    expect_equal(format(file.info(path)$mode), "600")
    expect_equal(dirname(dirname(path)), tempdir())
  }
  # The user's router is untouched.
  expect_identical(environment(router$endpoints[[1]][[1]]$getFunc()), globalenv())

  # In a fresh R process the saved router answers with what it captured.
  skip_if_not_installed("callr")
  body <- callr::r(function(path) {
    router <- readRDS(path)
    f <- router$endpoints[[1]][[1]]$getFunc()
    f(n = 2)
  }, args = list(path = path))
  expect_equal(body, 6)
})

test_that("connections and external pointers are refused, naming where they are", {
  con <- file(withr::local_tempfile(), "w")
  withr::defer(close(con))
  env <- new.env()
  env$con <- con
  handler <- local(function() writeLines("x", con), env)
  router <- plumber::pr() |> plumber::pr_get("/log", handler)
  err <- expect_error(valve:::save_router(router), class = "valve_router_error")
  expect_match(conditionMessage(err), "the handler of GET /log", fixed = TRUE)
  expect_match(conditionMessage(err), "`con`: a connection", fixed = TRUE)
  expect_match(conditionMessage(err), "valve.on_worker_start", fixed = TRUE)

  holder <- new.env()
  holder$ptr <- methods::new("externalptr")
  handler <- local(function() holder$ptr, list2env(list(holder = holder)))
  mounted <- plumber::pr() |> plumber::pr_get("/ptr", handler)
  router <- plumber::pr() |> plumber::pr_mount("/api", mounted)
  err <- expect_error(valve:::save_router(router), class = "valve_router_error")
  expect_match(conditionMessage(err), "the handler of GET /api/ptr \u2192 `holder` \u2192 `ptr`: an external pointer", fixed = TRUE)
})

test_that("a router that can travel is served by three workers at once", {
  skip_if_no_valve()
  # Each answer is the worker's pid and how often the start hook ran in it.
  router <- plumber::pr() |>
    plumber::pr_get("/pid", function() {
      Sys.sleep(1)
      c(Sys.getpid(), get0("hook_runs", globalenv(), ifnotfound = 0))
    })
  # The session's valve.on_worker_start travels with the router and runs once
  # in each worker (counted in the worker itself: as root, a worker runs as a
  # user of its own that sees none of this session's temporary files).
  hook_env <- new.env(parent = globalenv())
  withr::local_options(valve.on_worker_start = local(
    function() assign("hook_runs", get0("hook_runs", globalenv(), ifnotfound = 0) + 1, envir = globalenv()),
    hook_env
  ))
  api <- valve_start(router, n_min = 3, n_max = 3, timeout = 90)
  tree <- valve_tree(api$pid)
  withr::defer(lapply(tree, function(h) try(ps::ps_kill(h), silent = TRUE)))
  expect_true(dir.exists(api$run_dir))
  # valve serves the saved router.rds, or (a binary without .rds support) the
  # directory holding it and an entrypoint.R reading it.
  expect_match(api$app, basename(api$run_dir), fixed = TRUE)
  if (valve:::reads_rds(api$binary)) expect_match(api$app, "router\\.rds$")

  answers <- fetch_all(rep(paste0(api$url, "/pid"), 3))
  expect_equal(vapply(answers, `[[`, 0L, "status"), rep(200L, 3))
  answered <- lapply(answers, function(a) as.integer(jsonlite::fromJSON(a$body)))
  pids <- vapply(answered, `[`, 0L, 1)
  expect_equal(vapply(answered, `[`, 0L, 2), rep(1L, 3))
  expect_length(unique(pids), 3)
  expect_false(Sys.getpid() %in% pids)
  expect_setequal(pids, pids_of(tree[-1]))
  expect_setequal(api$status()$workers$pid, pids)
  # As root, the workers run as a user of their own, which read the router.
  if (valve:::is_root()) expect_false(any(vapply(tree[-1], function(h) ps::ps_uids(h)[["effective"]], 0L) == 0L))

  expect_equal(valve_stop(api), 0L)
  expect_true(all_gone(tree), info = paste("still running:", toString(pids_of(tree))))
  expect_false(dir.exists(api$run_dir))
})
