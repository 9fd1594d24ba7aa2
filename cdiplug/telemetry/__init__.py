"""What the daemon tells about itself: the recorder protocol, Prometheus metrics, the HTTP endpoint."""
