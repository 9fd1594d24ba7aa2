"""What pyproject.toml cannot say: every package is found, and the folder backends/ is cdiplug_backends.

setuptools' ``packages.find`` names a package after its folder; ``package-dir`` (in pyproject.toml)
maps cdiplug_backends to backends/, so the backends' packages are found there and renamed. A new
backend (or a new subpackage anywhere) is in the wheel without being listed; tests/packaging checks.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["cdiplug", "cdiplug.*"]),
        *("cdiplug_backends" + name.removeprefix("backends") for name in find_packages(include=["backends", "backends.*"])),
    ]
)
