# Writes the whales app's data: a CSV shaped like a CRAN mirror's download
# log (one row per download), about 50 MB, from a fixed seed, no network.
# Usage: Rscript generate.R OUT.csv [ROWS]
args <- commandArgs(trailingOnly = TRUE)
out <- if (length(args) >= 1) args[1] else "downloads.csv"
rows <- if (length(args) >= 2) as.integer(args[2]) else 580000L
set.seed(17)
days <- format(as.Date("2024-05-01") + 0:6)
packages <- sprintf("pkg%03d", 1:400)
pkg_weight <- 1 / seq_along(packages)^1.1
countries <- c("US", "DE", "GB", "FR", "CN", "IN", "JP", "BR", "CA", "AU", "NL", "KR", "ES", "IT", "CH")
# A few "whales" (ip ids 1..10) download a large share, as in the real logs.
ips <- c(sample(1:10, rows %/% 5, replace = TRUE), sample(11:60000, rows - rows %/% 5, replace = TRUE))
d <- data.frame(
  date = sample(days, rows, replace = TRUE),
  time = sprintf("%02d:%02d:%02d", sample(0:23, rows, TRUE), sample(0:59, rows, TRUE), sample(0:59, rows, TRUE)),
  size = as.integer(round(rlnorm(rows, 12, 1.5))),
  r_version = sample(c("4.3.1", "4.3.2", "4.2.3", "4.4.0", "4.1.3"), rows, TRUE),
  r_arch = sample(c("x86_64", "aarch64", "i386"), rows, TRUE, prob = c(0.85, 0.13, 0.02)),
  r_os = sample(c("linux-gnu", "mingw32", "darwin20"), rows, TRUE, prob = c(0.5, 0.35, 0.15)),
  package = sample(packages, rows, TRUE, prob = pkg_weight),
  version = sprintf("%d.%d.%d", sample(0:3, rows, TRUE), sample(0:12, rows, TRUE), sample(0:9, rows, TRUE)),
  country = sample(countries, rows, TRUE),
  ip_id = sample(ips),
  stringsAsFactors = FALSE
)
write.csv(d, out, row.names = FALSE)
cat(sprintf("%s: %d rows, %.1f MB\n", out, rows, file.size(out) / 1e6))
