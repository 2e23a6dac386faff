"""Where tools look for CA certificates: the one list, shared by the launcher (which points them at
the run's bundle) and verify's probe inside the sandbox (which searches them for the CA key).

Stdlib only and free of imports: the probe runs on whatever Python the sandbox has. Two copies of
these lists had already drifted (the probe missed /etc/ssl/cert.pem).
"""

from __future__ import annotations

#: Where distributions keep the system's PEM bundle (Debian/Ubuntu, Fedora/RHEL, Alpine/macOS-like, RHEL's extracted).
SYSTEM_BUNDLES: tuple[str, ...] = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
)
#: The variables through which tools find a CA bundle. uv reads SSL_CERT_FILE (its docs: "Custom
#: certificates"); Node adds NODE_EXTRA_CA_CERTS to its own roots; the rest replace their defaults.
BUNDLE_VARIABLES: tuple[str, ...] = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
    "CARGO_HTTP_CAINFO",
    "AWS_CA_BUNDLE",
    "DENO_CERT",
)
