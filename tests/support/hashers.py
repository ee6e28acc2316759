"""A password hasher for tests: PBKDF2-SHA256 with one iteration.

Its hashes are ordinary ``pbkdf2_sha256$1$salt$hash`` strings, so the servers and workers a test
starts, which keep Django's default hashers, verify them too (PBKDF2 reads the iteration count
from the hash). A password hashed at Django's 1,000,000 iterations costs about 0.4 s of CPU, and
most tests create a user or two.
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2(PBKDF2PasswordHasher):
    iterations = 1
