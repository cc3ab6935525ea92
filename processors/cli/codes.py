"""The exit codes of every ``runlog`` subcommand, defined once.

0 success; 1 the command ran and found a problem (a failed check, a difference, a blocked run)
or refused to act (a signal, cancel or retry that does not apply); 2 bad usage or configuration;
3 a service could not be reached; 4 the Kafka broker refused the credentials (authentication or
authorization failed).
"""

from __future__ import annotations

__all__ = ["EXIT_AUTH", "EXIT_FOUND", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNAVAILABLE", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_REFUSED = EXIT_FOUND
"""The operation does not apply to the run (the same code as a problem found)."""
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_AUTH = 4
"""The Kafka broker refused the credentials: a wrong SASL user or password, a failed TLS handshake,
or an authorization the principal lacks (one ``runlog: authentication failed: ...`` line)."""
