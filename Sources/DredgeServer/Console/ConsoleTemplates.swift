import Mustache

/// The console's pages and style, compiled into the server: nothing is fetched from elsewhere.
/// Every value goes in through `{{…}}`, which HTML-escapes it (`<`, `>`, `&`, `"`, `'`), and
/// only inside element text or double-quoted attributes; no page carries inline script or
/// style (the Content-Security-Policy forbids both).
enum ConsoleTemplates {
    static func library() throws -> MustacheLibrary {
        var library = MustacheLibrary()
        try library.register(layout, named: "layout")
        try library.register(signIn, named: "sign-in")
        try library.register(agents, named: "agents")
        return library
    }

    static let layout = """
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>{{title}} · Dredge</title>
        <link rel="stylesheet" href="/console/static/console.css">
        </head>
        <body>
        <header>
        <a class="brand" href="/console/agents">Dredge</a>
        {{#signedIn}}
        <nav aria-label="Pages">
        <a href="/console/agents"{{#onAgents}} aria-current="page"{{/onAgents}}>Agents</a>
        </nav>
        <form class="sign-out" method="post" action="/console/sign-out">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <span>{{tokenName}}</span>
        <button type="submit">Sign out</button>
        </form>
        {{/signedIn}}
        </header>
        <main>
        {{$content}}{{/content}}
        </main>
        </body>
        </html>
        """

    static let signIn = """
        {{<layout}}
        {{$content}}
        <h1>Sign in</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <form class="sign-in" method="post" action="/console/sign-in">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="token">Admin token</label>
        <input id="token" name="token" type="password" autocomplete="off" required autofocus>
        <button type="submit">Sign in</button>
        </form>
        <p class="hint">An admin token, as <code>dredge tokens create</code> or <code>dredge-server init</code> gave it. The session lasts {{hours}} hours.</p>
        {{/content}}
        {{/layout}}
        """

    static let agents = """
        {{<layout}}
        {{$content}}
        <h1>Agents</h1>
        <form class="filter" method="get" action="/console/agents" role="search">
        <label for="q">Filter</label>
        <input id="q" name="q" type="search" value="{{query}}" placeholder="host, app, user, id">
        <button type="submit">Filter</button>
        </form>
        <p class="summary">{{online}} online of {{total}}{{#query}}; {{shown}} match “{{query}}”{{/query}}</p>
        <table>
        <thead><tr><th scope="col">Status</th><th scope="col">Host</th><th scope="col">App</th><th scope="col">Users seen</th><th scope="col">Records</th><th scope="col">Last seen</th><th scope="col">Agent</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr>
        <td><span class="status {{status}}">{{status}}</span></td>
        <td>{{host}}{{#labels}}<br><small>{{labels}}</small>{{/labels}}</td>
        <td>{{app}}</td>
        <td>{{users}}</td>
        <td>{{records}}</td>
        <td>{{lastSeen}}</td>
        <td><code title="{{agentID}}">{{shortID}}</code></td>
        </tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="7">No agent{{#query}} matches{{/query}}.</td></tr>{{/rows}}
        </tbody>
        </table>
        {{/content}}
        {{/layout}}
        """

    static let css = """
        :root { color-scheme: light dark; --fg: #1b1f24; --bg: #ffffff; --muted: #57606a; --line: #d0d7de; --accent: #0b57d0; --bad: #b3261e; --good: #1a7f37; }
        @media (prefers-color-scheme: dark) { :root { --fg: #e6edf3; --bg: #0d1117; --muted: #9da7b3; --line: #30363d; --accent: #6ea8fe; --bad: #ff7b72; --good: #56d364; } }
        * { box-sizing: border-box; }
        body { margin: 0; font: 15px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
        header { display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; padding: .6rem 1rem; border-bottom: 1px solid var(--line); }
        header .brand { font-weight: 700; color: var(--fg); text-decoration: none; }
        header nav { display: flex; gap: .8rem; flex: 1; }
        header nav a { color: var(--accent); }
        header nav a[aria-current="page"] { color: var(--fg); font-weight: 600; text-decoration: none; }
        header .sign-out { display: flex; gap: .5rem; align-items: center; margin-left: auto; }
        main { padding: 1rem; max-width: 1400px; }
        h1 { font-size: 1.3rem; margin: .2rem 0 1rem; }
        a:focus, button:focus, input:focus { outline: 2px solid var(--accent); outline-offset: 2px; }
        input, button { font: inherit; padding: .35rem .6rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
        button { cursor: pointer; }
        form.sign-in { display: grid; gap: .5rem; max-width: 28rem; }
        form.filter { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin-bottom: .6rem; }
        .problem { color: var(--bad); font-weight: 600; }
        .hint, .summary, small { color: var(--muted); }
        table { border-collapse: collapse; width: 100%; }
        th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; overflow-wrap: anywhere; }
        .status.online { color: var(--good); font-weight: 600; }
        .status.offline { color: var(--muted); }
        @media (max-width: 700px) { th:nth-child(5), td:nth-child(5), th:nth-child(7), td:nth-child(7) { display: none; } }
        """
}
