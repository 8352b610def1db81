#!/usr/bin/env python3
"""A real OpenID Connect provider on loopback, for Dredge's single sign-on tests (#55).

The provider is django-oauth-toolkit (PyPI, maintained; OpenID Connect with PKCE, discovery,
JWKS, RP-initiated logout and the device authorization grant), configured here and nothing more:
its own views, models, token signing and checks answer every request. What this file adds is
configuration: a throw-away SQLite database, an RSA signing key, two clients (the console's,
confidential, and the CLI's, public, for the device flow), people and their groups, and the
`groups` claim (`claims_for`), as a company's identity provider is configured to send it.

    python3 oidc_provider.py --port 0 --console-redirect URL --state-dir DIR

prints one JSON line once it listens: {"issuer", "port", "console": {"id", "secret"},
"cli": {"id"}, "people": {name: password}}, then serves until killed (SIGTERM).
"""

import argparse
import json
import os
import secrets
import signal
import socket
import sys
import threading

PEOPLE = {
    # name: groups. The tests map `dredge-investigators` to the investigator role, `dredge-readers`
    # (with the `dredge_apps` claim) to a reader scoped to an app, and give `mallory` no group.
    "alice": ["dredge-investigators"],
    "rita": ["dredge-readers"],
    "mallory": ["marketing"],
}
APPS_CLAIM = {"rita": ["oven-control"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--console-redirect", action="append", default=[], help="the console's callback URL (repeatable)")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--id-token-seconds", type=int, default=300)
    args = parser.parse_args()
    # Whatever a parent left it (a signal ignored), SIGTERM ends it.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    port = listener.getsockname()[1]
    issuer = f"http://127.0.0.1:{port}/o"

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()

    # Django's login page needs a template: the plainest form.
    templates = os.path.join(args.state_dir, "templates")
    os.makedirs(templates, exist_ok=True)
    with open(os.path.join(templates, "login.html"), "w") as f:
        f.write(LOGIN_PAGE)

    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        SECRET_KEY=secrets.token_hex(32),
        ALLOWED_HOSTS=["127.0.0.1", "localhost"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "oauth2_provider",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "DIRS": [templates],
                "APP_DIRS": True,
                "OPTIONS": {"context_processors": ["django.template.context_processors.request", "django.contrib.auth.context_processors.auth"]},
            }
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(args.state_dir, "provider.sqlite")}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGIN_URL="/accounts/login/",
        USE_TZ=True,
        OAUTH2_PROVIDER={
            "OIDC_ENABLED": True,
            "OIDC_RSA_PRIVATE_KEY": pem,
            "OIDC_ISS_ENDPOINT": issuer,
            "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
            "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,
            "PKCE_REQUIRED": True,
            "ID_TOKEN_EXPIRE_SECONDS": args.id_token_seconds,
            "SCOPES": {"openid": "OpenID Connect", "profile": "Your name", "email": "Your email", "groups": "Your groups"},
            "OAUTH2_VALIDATOR_CLASS": __name__ + ".GroupsValidator",
            # The device authorization grant (`dredge login --sso`): where a person enters the
            # code, and a short polling interval so the tests do not wait five seconds a poll.
            "OAUTH_DEVICE_VERIFICATION_URI": issuer + "/device/",
            "DEVICE_FLOW_INTERVAL": 1,
        },
        # A failing request's traceback on stderr, beside the request lines.
        LOGGING={"version": 1, "handlers": {"stderr": {"class": "logging.StreamHandler"}}, "loggers": {"django.request": {"handlers": ["stderr"], "level": "ERROR"}}},
    )
    django.setup()
    define_urls_and_claims()

    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import get_application_model

    call_command("migrate", verbosity=0, interactive=False)
    people = {}
    for name, groups in PEOPLE.items():
        password = "pw" + secrets.token_urlsafe(12)  # never starts with "-", which a command line would read as an option
        user = User.objects.create_user(name, email=f"{name}@example.com", password=password, first_name=name.capitalize())
        for group in groups:
            user.groups.add(Group.objects.get_or_create(name=group)[0])
        people[name] = password
    Application = get_application_model()
    console_secret = "cs" + secrets.token_urlsafe(24)
    console = Application.objects.create(
        name="Dredge console",
        client_id="dredge-console",
        client_secret=console_secret,
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(args.console_redirect),
        # Where the console's sign-out comes back to: its sign-in page, beside `sso/callback`.
        post_logout_redirect_uris=" ".join(u.removesuffix("/sso/callback") + "/sign-in" for u in args.console_redirect),
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    Application.objects.create(
        name="Dredge CLI",
        client_id="dredge-cli",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_DEVICE_CODE,
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )

    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, format, *args):
            sys.stderr.write("provider: " + (format % args) + "\n")

    class Threaded(WSGIServer):
        def process_request(self, request, client_address):
            threading.Thread(target=self._serve, args=(request, client_address), daemon=True).start()

        def _serve(self, request, client_address):
            try:
                self.finish_request(request, client_address)
            finally:
                self.shutdown_request(request)

    listener.close()  # the port is free again for the server below, which binds it at once
    server = make_server("127.0.0.1", port, get_wsgi_application(), server_class=Threaded, handler_class=Quiet)
    print(json.dumps({"issuer": issuer, "port": port, "console": {"id": console.client_id, "secret": console_secret}, "cli": {"id": "dredge-cli"}, "people": people}), flush=True)
    server.serve_forever()


LOGIN_PAGE = """<!doctype html>
<html><head><title>Sign in to the example company</title></head><body>
<h1>Example company sign-in</h1>
{% if form.errors %}<p id="error">Your user name and password did not match.</p>{% endif %}
<form method="post" action="{% url 'login' %}">{% csrf_token %}
<label>User name <input name="username" autocomplete="username"></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<input type="hidden" name="next" value="{{ next }}">
<button type="submit">Sign in</button>
</form></body></html>
"""


def define_urls_and_claims():
    """The provider's URLs and claims, once Django is set up (they import its models)."""
    global urlpatterns, GroupsValidator
    from django.contrib.auth import views as auth_views
    from django.urls import include, path
    from oauth2_provider.oauth2_validators import OAuth2Validator

    # Its own views under /o/, and Django's own login page.
    urlpatterns = [
        path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
        path("accounts/login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    ]

    # The standard validator, with the person's groups in the ID token (`groups`) and the apps
    # a reader may see (`dredge_apps`), as an identity provider is configured to send them.
    class Validator(OAuth2Validator):
        oidc_claim_scope = None  # every claim below in the ID token, whatever scopes were asked

        def get_additional_claims(self, request):
            user = request.user
            claims = {"preferred_username": user.username, "email": user.email, "groups": sorted(g.name for g in user.groups.all())}
            if user.username in APPS_CLAIM:
                claims["dredge_apps"] = APPS_CLAIM[user.username]
            return claims

    GroupsValidator = Validator


if __name__ == "__main__":
    main()
