"""Running one service process: serve and supervise it (service, supervisor), its
aiohttp base and HTTP limits (web, http_limits, file_limit), its logs and background
tasks."""
