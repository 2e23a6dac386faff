"""The variables issue 13 names for the sandbox's trust in the run CA: the tests' oracle.

Written out here on purpose, not imported from launcher/run/trustpaths.py: a variable dropped from
the product's list must fail the tests, not change what they expect. One copy for every test.
"""

CA_VARIABLES = frozenset(
    {
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "CURL_CA_BUNDLE",
        "CARGO_HTTP_CAINFO",
        "AWS_CA_BUNDLE",
        "DENO_CERT",
    }
)
