"""`python -m vgpu.isolation.doctor [--driver-dir DIR] [--lib PATH] [--json FILE] [--quick]`."""
import sys

from vgpu.isolation.doctor.cli import main

sys.exit(main())
