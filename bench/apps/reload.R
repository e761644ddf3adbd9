# bench/reload's API: a fast call, and which version of the app answered
# (valve sets APP_VERSION per app in the config, and the script changes it).

#* @get /echo
function(msg = "") list(msg = paste0("The message is: '", msg, "'"))

#* @get /version
function() list(version = Sys.getenv("APP_VERSION"), pid = Sys.getpid())
