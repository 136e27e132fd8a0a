"""What the service tells its operators about itself: Prometheus metrics (tracing comes later)."""
