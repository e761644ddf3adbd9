# valve_deploy(): the bundle it makes, and publishing it to a real valve.

test_that("a bundle holds the app's files and a manifest naming its kind and packages", {
  dir <- withr::local_tempdir()
  writeLines(c("library(jsonlite)", "#* @get /", "function() toJSON(1)"), file.path(dir, "plumber.R"))
  dir.create(file.path(dir, "rsconnect"))
  writeLines("x", file.path(dir, "rsconnect", "record.dcf"))
  bundle <- deploy_bundle(dir, NULL)
  withr::defer(unlink(bundle))
  out <- withr::local_tempdir()
  utils::untar(bundle, exdir = out, tar = "internal")
  expect_setequal(list.files(out, recursive = TRUE), c("plumber.R", "manifest.json"))
  manifest <- jsonlite::fromJSON(file.path(out, "manifest.json"), simplifyVector = FALSE)
  expect_equal(manifest$metadata$appmode, "api")
  expect_equal(manifest$packages$jsonlite$description$Version, as.character(utils::packageVersion("jsonlite")))
  expect_error(deploy_appmode(withr::local_tempdir()), "holds no app valve publishes")
})

test_that("valve_deploy() publishes a new version that serves, and a wrong key is refused", {
  skip_if_no_valve()
  skip_unless_valve_has("publishing", "--publish-dir")
  work <- withr::local_tempdir()
  made <- system2(valve_binary(), c("publish-key", "r-tests"), stdout = TRUE)
  made <- made[!startsWith(made, "#")]
  writeLines(made[2], file.path(work, "keys"))
  # A site of one static app under its own path: a configured app at `/`
  # would leave no name free to publish (its paths are never taken).
  site <- file.path(work, "site")
  dir.create(file.path(site, "front"), recursive = TRUE)
  writeLines("<h1>front</h1>", file.path(site, "front", "index.html"))
  api <- valve_start(NULL, port = 0, site = site, publish_dir = file.path(work, "published"),
                     publish_keys_file = file.path(work, "keys"), timeout = 60)
  withr::defer(valve_stop(api, timeout = 10))
  app <- file.path(work, "hello")
  dir.create(app)
  writeLines(c("#* @get /version", "function() list(version = 1)"), file.path(app, "plumber.R"))
  expect_output(got <- valve_deploy(app, api$admin_url, key = made[1]), "switched")
  expect_equal(got$version, 1L)
  expect_equal(fetch(paste0(api$url, "/hello/version"))$body, "{\"version\":[1]}")
  writeLines(c("#* @get /version", "function() list(version = 2)"), file.path(app, "plumber.R"))
  got <- valve_deploy(app, api$admin_url, key = made[1], quiet = TRUE, allow_users = "ann")
  expect_equal(got$version, 2L)
  expect_equal(fetch(paste0(api$url, "/hello/version"))$status, 403L)
  expect_error(valve_deploy(app, api$admin_url, key = "not-a-key-valve-knows-at-all"), "401")
  expect_error(valve_deploy(app, "nowhere", key = made[1]), "publishing address")
})
