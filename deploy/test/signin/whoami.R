# deploy/test/signin.py's API: what plumber sees of the caller.

header <- function(req, name) {
  v <- req[[name]]
  if (is.null(v)) "" else v
}

#* @get /whoami
#* @serializer unboxedJSON
function(req) {
  list(
    user = header(req, "HTTP_X_FORWARDED_USER"),
    email = header(req, "HTTP_X_FORWARDED_EMAIL"),
    groups = header(req, "HTTP_X_FORWARDED_GROUPS"),
    credentials = header(req, "HTTP_SHINY_SERVER_CREDENTIALS"),
    remote_addr = header(req, "REMOTE_ADDR")
  )
}
