"""Extended resource names as the kubelet checks them (cdiplug.models.names), pure functions.

The expectations follow the kubelet's IsExtendedResourceName: not native (no '/' or containing
'kubernetes.io/'), no 'requests.' prefix, and a qualified name once prefixed with 'requests.'.
"""

from __future__ import annotations

import pytest

from cdiplug.models.names import extended_resource_problem, is_dns_subdomain, resource_class, socket_name

GOOD = [
    "example.com/fpga",
    "nvidia.com/gpu",
    "intel.com/sriov_netdevice",
    "a/b",
    "example.com/Upper.Case-1_x",
    "x-1.y2/z",
    "example.com/" + "n" * 63,
    "p" * 244 + "/x",
    "kubernetes.iox/gpu",  # only "kubernetes.io/" itself is reserved
]

BAD = [
    ("fpga", "needs a domain prefix"),
    ("example.com/fpga/x", "more than one '/'"),
    ("kubernetes.io/gpu", "kubernetes.io domain"),
    ("nodes.kubernetes.io/gpu", "kubernetes.io domain"),
    ("xkubernetes.io/gpu", "kubernetes.io domain"),
    ("requests.example.com/gpu", "must not start with 'requests.'"),
    ("Example.com/gpu", "not a DNS-1123 subdomain"),
    ("example_com/gpu", "not a DNS-1123 subdomain"),
    ("/gpu", "not a DNS-1123 subdomain"),
    ("example.com./gpu", "not a DNS-1123 subdomain"),
    ("-example.com/gpu", "not a DNS-1123 subdomain"),
    ("example.com\n/gpu", "not a DNS-1123 subdomain"),
    ("p" * 245 + "/x", "prefix is too long"),
    ("p" * 254 + "/x", "not a DNS-1123 subdomain"),
    ("example.com/", "must be at most 63 characters"),
    ("example.com/" + "n" * 64, "must be at most 63 characters"),
    ("example.com/-gpu", "must be at most 63 characters"),
    ("example.com/gpu.", "must be at most 63 characters"),
    ("example.com/g pu", "must be at most 63 characters"),
    ("example.com/gpu\n", "must be at most 63 characters"),
]


@pytest.mark.parametrize("name", GOOD)
def test_names_the_kubelet_accepts(name):
    assert extended_resource_problem(name) is None


@pytest.mark.parametrize(("name", "why"), BAD)
def test_names_the_kubelet_refuses(name, why):
    problem = extended_resource_problem(name)
    assert problem is not None and why in problem
    assert repr(name) in problem  # names the thing


def test_socket_name_and_class():
    assert socket_name("example.com/fpga") == "example.com-fpga.sock"
    assert socket_name("nvidia.com/gpu") == "nvidia.com-gpu.sock"
    assert resource_class("example.com/nic-vfio") == "nic-vfio"


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("worker-1", True),
        ("a.b-c.d", True),
        ("Worker", False),
        ("-a", False),
        ("a.", False),
        ("a" * 63 + "." + "b" * 63, True),
        ("a" * 253, True),
        ("a" * 254, False),
        ("node\n", False),
    ],
)
def test_dns_subdomain(name: str, ok: bool) -> None:
    assert is_dns_subdomain(name) is ok
