# A Shiny app started from R: valve serves it from its folder.

test_that("a Shiny app folder is served, and its page fetched", {
  skip_if_no_valve()
  skip_if_not_installed("shiny")
  dir <- withr::local_tempdir()
  writeLines(c(
    "library(shiny)",
    "ui <- fluidPage(titlePanel('valve says hello'), textOutput('pid'))",
    "server <- function(input, output) output$pid <- renderText(Sys.getpid())",
    "shinyApp(ui, server)"
  ), file.path(dir, "app.R"))
  app <- valve_start(dir, n_max = 2, timeout = 90)
  tree <- valve_tree(app$pid)
  withr::defer(lapply(tree, function(h) try(ps::ps_kill(h), silent = TRUE)))

  expect_equal(app$kind, "shiny")
  page <- fetch(paste0(app$url, "/"))
  expect_equal(page$status, 200L)
  expect_match(page$body, "valve says hello", fixed = TRUE)
  expect_match(page$body, "shiny", fixed = TRUE)
  expect_output(print(app), "(shiny)", fixed = TRUE)

  expect_equal(valve_stop(app), 0L)
  expect_true(all_gone(tree), info = paste("still running:", toString(pids_of(tree))))
})
