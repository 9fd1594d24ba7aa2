"""Resource claims between instances on one node (cdiplug.host.owners), against real flocks.

Two Owners in one process open the claim files separately, so their flocks conflict exactly as
two daemons' do; a claim held by a killed process is free again (the kernel drops the lock).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cdiplug.host.owners import OwnerConflict, Owners, claim_file, read_owner
from cdiplug.models.instance import DRA_DRIVER, RESOURCE

FPGA = (RESOURCE, "example.com/fpga")
NIC = (RESOURCE, "example.com/nic")


def test_a_resource_served_by_another_instance_is_refused_naming_it(tmp_path: Path) -> None:
    dp = Owners(tmp_path, "dp")
    dp.claim([FPGA])
    dra = Owners(tmp_path, "dra")
    with pytest.raises(OwnerConflict) as caught:
        dra.claim([NIC, FPGA])
    message = str(caught.value)
    assert "resource example.com/fpga is served on this node by instance 'dp'" in message
    assert f"pid {os.getpid()}" in message and "this is instance 'dra'" in message
    assert str(claim_file(tmp_path, *FPGA)) in message
    assert dra.held == set()  # all or nothing: NIC was let go again
    Owners(tmp_path, "other").claim([NIC])  # and is free for anyone
    dp.close()
    dra.claim([FPGA])  # released: free
    assert read_owner(claim_file(tmp_path, *FPGA))["instance"] == "dra"


def test_the_default_instance_is_named_as_such(tmp_path: Path) -> None:
    Owners(tmp_path).claim([(DRA_DRIVER, "fpga.example.com")])
    with pytest.raises(OwnerConflict, match=r"DRA driver fpga.example.com is served on this node by the default instance"):
        Owners(tmp_path, "named").claim([(DRA_DRIVER, "fpga.example.com")])


def test_one_instance_twice_is_refused_but_not_the_pods_of_a_rolling_update(tmp_path: Path) -> None:
    Owners(tmp_path, "a").claim([FPGA])
    with pytest.raises(OwnerConflict, match="instance 'a'"):
        Owners(tmp_path, "a").claim([FPGA])  # a second process of one instance, no rolling update
    old = Owners(tmp_path, "b", pod_uid="old-pod")
    old.claim([NIC])
    new = Owners(tmp_path, "b", pod_uid="new-pod")
    new.claim([NIC])  # the new pod of a surge shares the claim
    old.close()
    with pytest.raises(OwnerConflict, match="instance 'b'"):
        Owners(tmp_path, "c").claim([NIC])  # still held, by the new pod


def test_a_surge_from_a_pod_without_a_pod_uid_shares_the_claim(tmp_path: Path) -> None:
    # A DaemonSet rolled from a device-plugin configuration (no pod UID) to a DRA one (maxSurge 1,
    # its new pod with a pod UID): the new pod starts beside the old one and takes the resource over.
    Owners(tmp_path).claim([FPGA])
    Owners(tmp_path, pod_uid="new-pod").claim([FPGA])
    with pytest.raises(OwnerConflict, match="default instance"):
        Owners(tmp_path, "other", pod_uid="x").claim([FPGA])


def test_reload_keeps_only_what_is_configured(tmp_path: Path) -> None:
    owners = Owners(tmp_path, "a")
    owners.claim([FPGA, NIC])
    owners.keep_only([NIC])
    Owners(tmp_path, "b").claim([FPGA])
    assert owners.held == {NIC}


def test_a_claim_of_a_killed_process_is_free(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from cdiplug.host.owners import Owners
        Owners({str(tmp_path)!r}, "gone").claim([("resource", "example.com/fpga")])
        print("claimed", flush=True)
        sys.stdin.read()
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "claimed\n"
        with pytest.raises(OwnerConflict, match=rf"instance 'gone' \(pid {child.pid}\)"):
            Owners(tmp_path, "next").claim([FPGA])
    finally:
        child.kill()
        child.wait()
    Owners(tmp_path, "next").claim([FPGA])
    assert read_owner(claim_file(tmp_path, *FPGA))["instance"] == "next"


def test_a_symlink_planted_as_a_claim_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("x")
    path = claim_file(tmp_path, *FPGA)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(Exception, match="cannot open the lock"):
        Owners(tmp_path, "a").claim([FPGA])
    assert target.read_text() == "x"
