"""Every `vgpu scheduler` flag reaches the configuration it names (a flag that parses but is dropped on the way
is the bug this guards against: `--dra` once was)."""

import pytest

from vgpu.cli import build_parser
from vgpu.scheduler.cli import flag_overrides
from vgpu.scheduler.config import SchedulerConfig, load_config

NOT_CONFIG = {"config", "func", "command", "log_level", "help"}


def _scheduler_actions():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return [a for a in sub.choices["scheduler"]._actions if a.dest not in NOT_CONFIG]


def test_every_flag_names_a_configuration_field():
    missing = [a.option_strings[0] for a in _scheduler_actions() if a.dest not in SchedulerConfig.model_fields]
    assert not missing


@pytest.mark.parametrize("argv, key, value", [
    (["--dra"], "dra", True),
    (["--leader-elect"], "leader_elect", True),
    (["--assume-ttl", "7"], "assume_ttl_seconds", 7.0),
    (["--node-policy", "binpack"], "node_policy", "binpack"),
    (["--scheduler-names", "a, b"], "scheduler_names", ["a", "b"]),
])
def test_a_given_flag_overrides_the_default(argv, key, value):
    args = build_parser().parse_args(["scheduler", *argv])
    config = load_config(None, flag_overrides(args))
    assert getattr(config, key) == value
    assert getattr(load_config(None, flag_overrides(build_parser().parse_args(["scheduler"]))), key) != value


def test_following_a_lease_reaches_the_configuration_and_refuses_what_cannot_work():
    from vgpu.errors import ConfigError

    def load(*argv):
        return load_config(None, flag_overrides(build_parser().parse_args(["scheduler", *argv])))

    config = load("--follow-lease", "vgpu-system/vgpu-kube-scheduler", "--leader-identity", "vgpu-scheduler-0")
    assert (config.follow_lease, config.leader_identity) == ("vgpu-system/vgpu-kube-scheduler", "vgpu-scheduler-0")
    for argv, message in (
            (["--follow-lease", "vgpu-kube-scheduler"], "expected NAMESPACE/NAME"),
            (["--follow-lease", "a/b/c"], "expected NAMESPACE/NAME"),
            (["--follow-lease", "a/b", "--leader-elect"], "give one"),
            (["--leader-identity", "x"], "needs --follow-lease")):
        with pytest.raises(ConfigError, match=message):
            load(*argv)
