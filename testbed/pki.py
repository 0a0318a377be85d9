"""TEST INFRASTRUCTURE: certificate authorities and the certificates they sign (the `cryptography` package): the
serving certificate of the admission webhook the test bed registers, and for the real-Kubernetes tier the API
server's serving certificate and each component's client certificate (kube-apiserver's x509 authenticator takes
the user from the subject's common name and the groups from its organizations)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=1)
_SKEW = datetime.timedelta(minutes=5)


def _name(cn: str, organizations: Sequence[str] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
                     + [x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    """A private key as unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _usage(signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_cert_sign=signing, crl_sign=signing, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
                         decipher_only=False)


class CertificateAuthority:
    """A self-signed CA written to `folder/<name>.crt` (and `.key`), which signs leaf certificates into `folder`."""

    def __init__(self, folder: Path, name: str = "ca", common_name: str = "vgpu-test-ca") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - _SKEW).not_valid_after(now + _VALID)
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(_usage(True), critical=True)
                      .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                                     critical=False)
                      .sign(self._key, hashes.SHA256()))
        self.cert = folder / f"{name}.crt"
        self.key = folder / f"{name}.key"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        self.key.write_bytes(pem_key(self._key))

    def issue(self, name: str, common_name: str, organizations: Sequence[str] = (), dns_names: Sequence[str] = (),
              ips: Sequence[str] = (), server: bool = False, client: bool = False) -> tuple[Path, Path]:
        """`folder/<name>.crt` and `.key`: a leaf for the subject, with the names and the usages asked."""
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + ([ExtendedKeyUsageOID.CLIENT_AUTH]
                                                                          if client else [])
        builder = (x509.CertificateBuilder().subject_name(_name(common_name, organizations))
                   .issuer_name(self._cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - _SKEW).not_valid_after(now + _VALID)
                   .add_extension(_usage(False), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                                  critical=False))
        sans = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert_path, key_path = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_path.write_bytes(builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(pem_key(key))
        return cert_path, key_path


def make_pki(folder: Path, dns_names=("localhost",), ips=("127.0.0.1",)) -> dict[str, Path]:
    """ca.crt, tls.crt and tls.key in `folder`: a CA and a server certificate it signed for the names and IPs."""
    ca = CertificateAuthority(folder)
    cert, key = ca.issue("tls", dns_names[0], dns_names=dns_names, ips=ips, server=True)
    return {"ca": ca.cert, "cert": cert, "key": key}
