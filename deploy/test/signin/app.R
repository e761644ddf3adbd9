# deploy/test/signin.py's Shiny app: shows who Shiny says the user is.
library(shiny)

ui <- fluidPage(
  p("user: ", textOutput("user", inline = TRUE)),
  p("groups: ", textOutput("groups", inline = TRUE))
)

server <- function(input, output, session) {
  output$user <- renderText(if (is.null(session$user)) "(nobody)" else session$user)
  output$groups <- renderText(if (length(session$groups) == 0) "(none)" else paste(session$groups, collapse = ","))
}

shinyApp(ui, server)
