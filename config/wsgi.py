import os

from django.core.wsgi import get_wsgi_application

from core.tracing import configure_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Before the application loads its middleware: Django's instrumentation adds one.
configure_tracing("web")
application = get_wsgi_application()

from config.apps import discover_admin_pages  # noqa: E402  (needs the apps)

# At start-up, not at the first request: Django loads the URLconf lazily.
discover_admin_pages()

from audit.db_roles import refuse_privileged_database_role  # noqa: E402  (needs the apps)

refuse_privileged_database_role()
