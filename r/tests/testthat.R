# R CMD check runs the suite here; r/run-tests.sh runs the same files against
# an installed copy. Tests that need the valve binary skip without one.
library(testthat)
library(valve)

test_check("valve")
