"""The static files storage of DEBUG-off starts: whitenoise's (fingerprinted names from the manifest
that collectstatic writes, compressed copies), except that a file the manifest does not know is no
error of the page naming it. Django's manifest storage raises ValueError there, and the page, the
500 page included, answered 500 instead; here the page names the file by its plain name, which
answers 404 (logged as any 404 is).

A file of the project that is missing only from the collected files (collectstatic was not run
since it was added) is also logged once per process, with what to run. Other names are not:
whitenoise asks for names that may not exist to tell fingerprinted files from others.
"""

import logging

from django.contrib.staticfiles import finders
from whitenoise.storage import CompressedManifestStaticFilesStorage

log = logging.getLogger(__name__)


class ForgivingManifestStorage(CompressedManifestStaticFilesStorage):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._unversioned: set[str] = set()

    def stored_name(self, name):
        try:
            return super().stored_name(name)
        except ValueError:
            if name not in self._unversioned:
                self._unversioned.add(name)
                if finders.find(name):
                    log.warning("static file %s is not among the collected static files in %s: pages link it "
                                "unversioned, where it answers 404. Run `manage.py collectstatic`.", name,
                                self.location, extra={"action": "static_file_not_collected"})
            return name
