"""The gRPC edge shared by both front ends: unix-socket servers and lenient request decoding."""
