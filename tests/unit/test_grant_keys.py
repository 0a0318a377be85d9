"""Grant signatures: Ed25519 (the scheduler signs, nodes hold only public keys, two public keys during a rotation),
the shared-secret HMAC of earlier releases, and key files as the admin makes them with openssl (docs/install.md)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key

from vgpu import grants
from vgpu.errors import ConfigError

VALUE = "GPU-a,NVIDIA,1000,10:"


def _pem_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _read(tmp_path, name: str, data: bytes, private_allowed: bool = True) -> grants.GrantKey:
    path = tmp_path / name
    path.write_bytes(data)
    return grants.read_key(path, "--grant-key-file", private_allowed=private_allowed)


def test_the_scheduler_signs_and_a_node_with_the_public_key_checks(tmp_path):
    private = Ed25519PrivateKey.generate()
    scheduler = _read(tmp_path, "grant.key", _pem_private(private))
    node = _read(tmp_path, "grant.pub", _pem_public(private), private_allowed=False)
    signature = scheduler.sign("uid-1", "node-a", VALUE)
    assert signature.startswith("v2:")
    assert node.verify(signature, "uid-1", "node-a", VALUE) and scheduler.verify(signature, "uid-1", "node-a", VALUE)
    # the signature covers the pod, the node and the assignment
    assert not node.verify(signature, "uid-2", "node-a", VALUE)
    assert not node.verify(signature, "uid-1", "node-b", VALUE)
    assert not node.verify(signature, "uid-1", "node-a", "GPU-a,NVIDIA,1000,90:")
    assert not node.can_sign
    with pytest.raises(ValueError, match="cannot sign"):
        node.sign("uid-1", "node-a", VALUE)


def test_another_key_or_a_mangled_signature_does_not_verify(tmp_path):
    node = _read(tmp_path, "grant.pub", _pem_public(Ed25519PrivateKey.generate()), private_allowed=False)
    forged = grants.GrantKey(private=Ed25519PrivateKey.generate()).sign("uid-1", "node-a", VALUE)
    assert not node.verify(forged, "uid-1", "node-a", VALUE)
    for bad in (None, 7, "", "v2:", "v2:not base64!", "v2:" + "A" * 88, "v9:abc", "v1:00"):
        assert not node.verify(bad, "uid-1", "node-a", VALUE), bad


def test_two_public_keys_are_accepted_during_a_rotation_and_a_dropped_one_no_longer(tmp_path):
    old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    by_old = grants.GrantKey(private=old).sign("u", "n", VALUE)
    by_new = grants.GrantKey(private=new).sign("u", "n", VALUE)
    both = _read(tmp_path, "keys.pem", _pem_public(old) + _pem_public(new), private_allowed=False)
    assert both.verify(by_old, "u", "n", VALUE) and both.verify(by_new, "u", "n", VALUE)
    # the scheduler's file after step 2: the new private key, then the old public key
    scheduler = _read(tmp_path, "grant.key", _pem_private(new) + _pem_public(old))
    assert scheduler.verify(by_old, "u", "n", VALUE) and scheduler.sign("u", "n", VALUE) == by_new
    after = _read(tmp_path, "keys.pem", _pem_public(new), private_allowed=False)
    assert after.verify(by_new, "u", "n", VALUE) and not after.verify(by_old, "u", "n", VALUE)


def test_a_node_is_refused_the_private_key_and_other_key_files_are_refused_clearly(tmp_path):
    private = _pem_private(Ed25519PrivateKey.generate())
    with pytest.raises(ConfigError, match="holds a private key; a node needs only the scheduler's public key"):
        _read(tmp_path, "grant.key", private, private_allowed=False)
    with pytest.raises(ConfigError, match="more than one private key"):
        _read(tmp_path, "two.key", private + _pem_private(Ed25519PrivateKey.generate()))
    rsa = generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with pytest.raises(ConfigError, match="PEM block 1 is not an Ed25519 key"):
        _read(tmp_path, "rsa.key", rsa)
    with pytest.raises(ConfigError, match="PEM block 1 is a CERTIFICATE"):
        _read(tmp_path, "cert.pem", b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="PEM block 1 does not load"):
        _read(tmp_path, "broken.pem", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    with pytest.raises(ConfigError, match="the key has 5 bytes, at least 32"):
        _read(tmp_path, "short", b"short")
    with pytest.raises(ConfigError, match="No such file"):
        grants.read_key(tmp_path / "missing", "--grant-key-file")


def test_a_shared_secret_of_earlier_releases_still_signs_and_checks(tmp_path):
    shared = _read(tmp_path, "secret", b"s" * 64, private_allowed=False)
    signature = shared.sign("u", "n", VALUE)
    assert signature.startswith("v1:") and shared.verify(signature, "u", "n", VALUE)
    assert not shared.verify(signature, "u", "n2", VALUE)
    # an Ed25519 holder does not accept HMAC signatures, nor the reverse
    ed = grants.GrantKey(private=Ed25519PrivateKey.generate())
    assert not ed.verify(signature, "u", "n", VALUE)
    assert not shared.verify(ed.sign("u", "n", VALUE), "u", "n", VALUE)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_install_guides_openssl_commands_make_files_both_sides_read(tmp_path):
    """The two openssl commands of docs/install.md, run as written: the scheduler reads grant.key, a node
    grant.pub, and what one signs the other checks."""
    subprocess.run("openssl genpkey -algorithm ed25519 -out grant.key && openssl pkey -in grant.key -pubout "
                   "-out grant.pub", shell=True, cwd=tmp_path, check=True, capture_output=True)
    scheduler = grants.read_key(tmp_path / "grant.key", "--grant-key-file")
    node = grants.read_key(tmp_path / "grant.pub", "GRANT_KEY_FILE", private_allowed=False)
    assert node.verify(scheduler.sign("u", "n", VALUE), "u", "n", VALUE)
