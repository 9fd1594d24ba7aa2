"""The gRPC edges shared by the front ends: unix-socket servers, lenient request decoding, the
kubelet's PodResources client."""
