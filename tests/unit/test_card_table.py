"""One card table, two readers of the node spec: the product's simulated backend (node/backends/sim.py) and the
test bed's machine (testbed/machine.py, which may not import the product) both load node/backends/cards.json, and
their two parsers of the spec grammar (`4xA100-40GB+mig@nvlink4/numa2`) read every spec the same way and refuse the
same ones."""

from __future__ import annotations

import pytest

from vgpu.errors import ConfigError
from vgpu.node.backends import sim
from vgpu.testbed import machine

SPECS = ["A100-40GB", "4xA100-40GB", "1xT4,1xA100-40GB", "2xa100-80gb", "1xA100-40GB+mig", "8xH100-80GB@nvlink4",
         "8xH100-80GB@nvlink8/numa2", "4xRTX4090/numa4", "2xH200,2xL40S,1xL4,1xA10,1xA30,1xV100-16GB,1xV100-32GB",
         "16xH100-80GB@nvlink16", "4xT4,"]
BAD = ["4xB300", "0xT4", "3xH100-80GB@nvlink2", "8xH100-80GB@nvlink1", "4xT4/numa0", "4xT4/numa9", "4x", "x4T4",
       "4xT4@nvlink4@nvlink2", "2xT4/numa3"]


def test_both_load_the_same_cards():
    assert sim.MODELS.keys() == machine.MODELS.keys()
    for name, card in sim.MODELS.items():
        assert (card.nvml_name, card.memory_mib, card.sms) == (machine.MODELS[name].nvml_name,
                                                               machine.MODELS[name].memory_mib,
                                                               machine.MODELS[name].sms)
        assert card.architecture and card.compute_capability


@pytest.mark.parametrize("spec", SPECS)
def test_both_parsers_read_a_spec_alike(spec):
    entries, numa = sim.parse_sim_layout(spec)
    bed, bed_numa = machine.parse_machine_spec(spec)
    assert numa == bed_numa
    assert [(sim.MODELS[m].nvml_name, count, mig, island) for m, count, mig, island in entries] == \
        [(e.model.nvml_name, e.count, e.mig, e.island) for e in bed]


@pytest.mark.parametrize("spec", BAD)
def test_both_parsers_refuse_a_bad_spec(spec):
    with pytest.raises(ConfigError):
        sim.parse_sim_layout(spec)
    with pytest.raises(machine.MachineSpecError):
        machine.parse_machine_spec(spec)


def test_an_empty_spec_is_a_node_without_gpus_for_the_product_only():
    for spec in ("", ","):
        assert sim.parse_sim_layout(spec) == ([], 0)   # a plugin on a node with no GPUs starts, and offers none
        with pytest.raises(machine.MachineSpecError):   # a test-bed node is built to hold GPUs
            machine.parse_machine_spec(spec)
