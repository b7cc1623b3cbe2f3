"""A job's chart: the points the bot keeps from progress reports (series), and the picture drawn from them."""
