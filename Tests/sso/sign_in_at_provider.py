#!/usr/bin/env python3
"""A person at the identity provider, for the in-process single sign-on tests (#55).

Signs in at the provider's own login page (oidc_provider.py) and follows an authorization URL
as a browser would, then prints where the provider sends the browser back (the console's
callback, with its code and state) without going there: the test takes it to the console.

    sign_in_at_provider.py --authorize URL --user NAME --password PASSWORD

With --id-token-for CLIENT_SECRET, it runs the whole code flow itself (PKCE, nonce `n1`) and
prints the ID token instead: a real token, for the tests of its verification.

    sign_in_at_provider.py --verification URL --user-code CODE --user NAME --password PASSWORD [--deny]

is the person's side of the device authorization grant (`dredge login --sso`): signed in, they
open the verification URL the command printed, enter its code and accept (or deny) the request.
"""

import argparse
import base64
import hashlib
import http.cookiejar
import json
import re
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--authorize")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--issuer")
    parser.add_argument("--redirect")
    parser.add_argument("--id-token-for", dest="secret")
    parser.add_argument("--verification")
    parser.add_argument("--user-code")
    parser.add_argument("--deny", action="store_true")
    args = parser.parse_args()

    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), NoRedirect)

    def location(url, data=None, headers=None):
        try:
            opener.open(urllib.request.Request(url, data=data, headers=headers or {}))
        except urllib.error.HTTPError as e:
            if e.code in (301, 302, 303, 307):
                return urllib.parse.urljoin(url, e.headers["Location"])
            raise
        raise SystemExit(f"{url} did not redirect")

    def csrf_of(page):
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)

    authorize = args.authorize or args.verification
    verifier = None
    if args.secret:
        verifier = secrets.token_urlsafe(48)
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        query = {"response_type": "code", "client_id": "dredge-console", "redirect_uri": args.redirect, "scope": "openid profile email",
                 "state": "s1", "nonce": "n1", "code_challenge": challenge, "code_challenge_method": "S256"}
        authorize = args.issuer + "/authorize/?" + urllib.parse.urlencode(query)
    origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlparse(authorize))

    login = origin + "/accounts/login/"
    csrf = csrf_of(opener.open(login).read().decode())
    form = urllib.parse.urlencode({"username": args.user, "password": args.password, "csrfmiddlewaretoken": csrf, "next": "/"}).encode()
    after = location(login, form, {"Referer": login})
    if after.rstrip("/").endswith("/accounts/login"):
        raise SystemExit("the provider refused the password")
    if args.verification:
        # The page asks for the code, then where it sends the person asks to accept or deny.
        page = opener.open(args.verification).read().decode()
        form = urllib.parse.urlencode({"user_code": args.user_code, "csrfmiddlewaretoken": csrf_of(page)}).encode()
        confirm = location(args.verification, form, {"Referer": args.verification})
        page = opener.open(confirm).read().decode()
        action = "deny" if args.deny else "accept"
        form = urllib.parse.urlencode({"action": action, "csrfmiddlewaretoken": csrf_of(page)}).encode()
        status = location(confirm, form, {"Referer": confirm})
        print(f"{action}ed: {status}")
        return
    back = location(authorize)
    if not args.secret:
        print(back)
        return
    code = urllib.parse.parse_qs(urllib.parse.urlparse(back).query)["code"][0]
    basic = base64.b64encode(f"dredge-console:{args.secret}".encode()).decode()
    body = urllib.parse.urlencode({"grant_type": "authorization_code", "code": code, "redirect_uri": args.redirect, "code_verifier": verifier}).encode()
    tokens = json.loads(urllib.request.urlopen(urllib.request.Request(args.issuer + "/token/", data=body, headers={"Authorization": "Basic " + basic})).read())
    print(tokens["id_token"])


if __name__ == "__main__":
    main()
