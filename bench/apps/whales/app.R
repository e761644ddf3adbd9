# "whales": a synchronous Shiny app shaped like the Shiny team's cranwhales
# case study, for bench/shiny-load. It reads a ~50 MB CSV of download logs
# (bench/apps/whales/generate.R writes one) and draws four ggplot2 charts on
# three tabs; every chart recomputes when the day or the number of whales changes.
#
# WHALES_CSV: the CSV's path. WHALES_DATA: "session" (default, as the case
# study's app: every session parses the CSV when it starts) or "global" (parsed
# once per R process, at the top level: with valve --preload the parent parses
# it once and every fork shares it).
library(shiny)
library(ggplot2)
suppressPackageStartupMessages(library(dplyr))

csv <- Sys.getenv("WHALES_CSV", "downloads.csv")
per_session <- Sys.getenv("WHALES_DATA", "session") != "global"

read_downloads <- function() {
  read.csv(csv, colClasses = c("character", "character", "integer", "character", "character",
                               "character", "character", "character", "character", "integer"))
}

# Parsed here, at the top level, once per process (or once in valve's preload parent).
downloads_all <- if (per_session) NULL else read_downloads()
days <- format(as.Date("2024-05-01") + 0:6)

ui <- fluidPage(
  titlePanel("CRAN whales"),
  sidebarLayout(
    sidebarPanel(
      selectInput("day", "Day", days, selected = days[1]),
      numericInput("count", "Whales to show", 6, min = 1, max = 25),
      textOutput("total")
    ),
    mainPanel(
      tabsetPanel(id = "tabs",
        tabPanel("All traffic", plotOutput("hourly", height = "300px"), plotOutput("packages", height = "300px")),
        tabPanel("Biggest whales", plotOutput("whales", height = "400px")),
        tabPanel("Whales by hour", plotOutput("whales_hourly", height = "500px"))
      )
    )
  )
)

server <- function(input, output, session) {
  # The case study's app: each session loads its own copy of the data.
  downloads <- if (per_session) read_downloads() else downloads_all

  day <- reactive({
    downloads %>% filter(date == input$day) %>% mutate(hour = as.integer(substr(time, 1, 2)))
  })
  whales <- reactive({
    day() %>% count(ip_id, name = "downloads", sort = TRUE) %>% head(input$count)
  })

  output$total <- renderText({
    sprintf("%s downloads on %s from %s addresses",
            format(nrow(day()), big.mark = ","), input$day, format(n_distinct(day()$ip_id), big.mark = ","))
  })
  output$hourly <- renderPlot({
    ggplot(count(day(), hour), aes(hour, n)) + geom_col(fill = "steelblue") +
      labs(x = "hour (UTC)", y = "downloads", title = "Downloads by hour")
  })
  output$packages <- renderPlot({
    top <- day() %>% count(package, sort = TRUE) %>% head(15)
    ggplot(top, aes(reorder(package, n), n)) + geom_col() + coord_flip() +
      labs(x = NULL, y = "downloads", title = "Top packages")
  })
  output$whales <- renderPlot({
    ggplot(whales(), aes(reorder(factor(ip_id), downloads), downloads)) + geom_col(fill = "darkred") + coord_flip() +
      labs(x = "address id", y = "downloads", title = sprintf("The %d biggest whales", input$count))
  })
  output$whales_hourly <- renderPlot({
    d <- day() %>% filter(ip_id %in% whales()$ip_id) %>% count(ip_id, hour)
    ggplot(d, aes(hour, n)) + geom_col() + facet_wrap(~ip_id) +
      labs(x = "hour (UTC)", y = "downloads", title = "Whales by hour")
  })
}

shinyApp(ui, server)
