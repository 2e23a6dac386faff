"""Policy files: reading them (hostile input), includes, bundled lists, checks, trust and "always" answers."""
