"""The generic backend's options through the real config loader: what users of
generic-device-plugin write, and each bad value refused with its field and file."""

from __future__ import annotations

import pytest

from cdiplug.errors import ConfigError

from .conftest import resources


def test_a_generic_device_plugin_configuration_in_snake_case_loads() -> None:
    (r,) = resources(
        (
            "example.com/serial",
            {
                "groups": [
                    {
                        "paths": [{"path": "/dev/ttyUSB*", "mount_path": "/dev/serial/", "permissions": "rw", "limit": 2}],
                        "count": 2,
                    },
                    {"usb": [{"vendor": "0403", "product": "6001", "serial": "FT*"}]},
                    {
                        "paths": [
                            {"path": "/dev/shm/x", "type": "mount", "read_only": True, "optional": True},
                            {"path": "/dev/fuse"},
                        ]
                    },
                ]
            },
        )
    )
    assert r.options.groups[0].count == 2 and r.options.groups[1].usb[0].serial == "FT*"


@pytest.mark.parametrize(
    ("options", "where", "says"),
    [
        ({"groups": [{"paths": [{"path": "/etc/*"}]}]}, "groups[0].paths[0].path", "only paths under /dev"),
        ({"groups": [{"paths": [{"path": "/dev/../etc/shadow"}]}]}, "groups[0].paths[0].path", "'..'"),
        ({"groups": [{"paths": [{"path": "dev/fuse"}]}]}, "groups[0].paths[0].path", "absolute"),
        ({"groups": [{"usb": [{"vendor": "403"}]}]}, "groups[0].usb[0].vendor", "quote the value"),
        ({"groups": [{"usb": [{"vendor": "0x0403"}]}]}, "groups[0].usb[0].vendor", 'without 0x (such as "0403")'),
        ({"groups": [{"paths": [{"path": "/dev/fuse"}], "count": 0}]}, "groups[0].count", "at least 1"),
        (
            {"groups": [{"paths": [{"path": "/dev/fuse"}]}, {"paths": [{"path": "/dev/fuse"}]}]},
            "groups[1].paths[0].path",
            "two groups",
        ),
        ({"groups": [{"paths": [{"path": "/dev/fuse", "permissions": "rx"}]}]}, "groups[0].paths[0].permissions", "r, w and m"),
        ({"groups": [{"paths": [{"path": "/dev/fuse"}], "usb": [{"vendor": "0403"}]}]}, "groups[0]", "either paths or usb"),
        ({"groups": []}, "groups", "at least one group"),
        ({"groups": [{"paths": [{"path": "/dev/fuse", "optional": True}]}]}, "groups[0].paths", "must not be optional"),
        ({"groups": [{"paths": [{"path": "/dev/fuse", "mountPath": "/x"}]}]}, "groups[0].paths[0]", "mountPath"),
    ],
)
def test_bad_options_name_the_field_and_the_file(options: dict, where: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        resources(("example.com/xx", options))
    message = str(err.value)
    assert f"$.resources[0].options.{where}" in message and says in message and "test.yaml" in message


def test_a_number_for_a_vendor_id_is_refused_with_the_hint_to_quote_it() -> None:
    # YAML reads vendor: 0403 as the number 403 (and 0x0403 as 1027): the message says to quote it.
    with pytest.raises(ConfigError) as err:
        resources(("example.com/xx", {"groups": [{"usb": [{"vendor": 1027}]}]}))
    assert "$.resources[0].options.groups[0].usb[0].vendor" in str(err.value)
