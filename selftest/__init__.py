"""The proof, apart from the run path: `sandgate verify`'s probes, worlds and canaries (the product never imports it)."""
