import Mustache

/// The console's pages and style, compiled into the server: nothing is fetched from elsewhere.
/// Every value goes in through `{{…}}`, which HTML-escapes it (`<`, `>`, `&`, `"`, `'`), and
/// only inside element text or double-quoted attributes; no page carries inline script or
/// style (the Content-Security-Policy forbids both).
enum ConsoleTemplates {
    /// The content type every template names (`{{% CONTENT_TYPE: DREDGE_HTML}}`).
    static let contentType = "DREDGE_HTML"

    /// HTML escaping by Unicode scalar. swift-mustache's own escapes by `Character`, a grapheme
    /// cluster: a `<` after U+0600, or a `"` before a combining accent, is part of a cluster
    /// that is not in its table, and went out raw — markup any agent could plant in its host
    /// name. Here every `<`, `>`, `&`, `"` and `'` is escaped whatever surrounds it.
    struct HTML: MustacheContentType {
        func escapeText(_ text: String) -> String { Self.escape(text) }

        static func escape(_ text: String) -> String {
            guard text.utf8.contains(where: { $0 == 0x3C || $0 == 0x3E || $0 == 0x26 || $0 == 0x22 || $0 == 0x27 }) else { return text }
            var out = String.UnicodeScalarView()
            for scalar in text.unicodeScalars {
                switch scalar {
                case "<": out.append(contentsOf: "&lt;".unicodeScalars)
                case ">": out.append(contentsOf: "&gt;".unicodeScalars)
                case "&": out.append(contentsOf: "&amp;".unicodeScalars)
                case "\"": out.append(contentsOf: "&quot;".unicodeScalars)
                case "'": out.append(contentsOf: "&#39;".unicodeScalars)
                default: out.append(scalar)
                }
            }
            return String(out)
        }
    }

    static func library() throws -> MustacheLibrary {
        MustacheContentTypes.register(HTML(), named: contentType)
        var library = MustacheLibrary()
        try library.register(layout, named: "layout")
        try library.register(signIn, named: "sign-in")
        try library.register(agents, named: "agents")
        try library.register(error, named: "error")
        try library.register(audit, named: "audit")
        try library.register(tokens, named: "tokens")
        try library.register(pulls, named: "pulls")
        try library.register(newPull, named: "new-pull")
        try library.register(pull, named: "pull")
        try library.register(feedback, named: "feedback")
        try library.register(logs, named: "logs")
        return library
    }

    static let layout = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>{{title}} · Dredge</title>
        <link rel="stylesheet" href="/console/static/console.css">
        <link rel="icon" href="/console/static/icon.svg" type="image/svg+xml">
        <script src="/console/static/console.js" defer></script>
        </head>
        <body>
        <header>
        <a class="brand" href="/console/agents">Dredge</a>
        {{#signedIn}}
        <nav aria-label="Pages">
        <a href="/console/agents"{{#onAgents}} aria-current="page"{{/onAgents}}>Agents</a>
        <a href="/console/pulls"{{#onPulls}} aria-current="page"{{/onPulls}}>Pulls</a>
        <a href="/console/logs"{{#onLogs}} aria-current="page"{{/onLogs}}>Logs</a>
        <a href="/console/feedback"{{#onFeedback}} aria-current="page"{{/onFeedback}}>Feedback</a>
        <a href="/console/audit"{{#onAudit}} aria-current="page"{{/onAudit}}>Audit log</a>
        <a href="/console/tokens"{{#onTokens}} aria-current="page"{{/onTokens}}>Tokens</a>
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
        {{% CONTENT_TYPE: DREDGE_HTML}}
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

    static let error = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>{{heading}}</h1>
        <p class="problem" role="alert">{{message}}</p>
        <p><a href="/console/agents">Back to the console</a></p>
        {{/content}}
        {{/layout}}
        """

    static let agents = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Agents</h1>
        <form class="filter" method="get" action="/console/agents" role="search">
        <label for="q">Filter</label>
        <input id="q" name="q" type="search" value="{{query}}" placeholder="host, app, user, id">
        <button type="submit">Filter</button>
        </form>
        <p class="summary">{{online}} online of {{total}}{{#filtered}}; {{shown}} match “{{query}}”{{/filtered}}</p>
        <div class="table-wrap">
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
        <td class="nowrap">{{lastSeen}}</td>
        <td><code title="{{agentID}}">{{shortID}}</code></td>
        </tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="7">No agent{{#filtered}} matches{{/filtered}}.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{/content}}
        {{/layout}}
        """

    static let icon = """
        <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#0b57d0"/><path d="M4 4h4.5a4 4 0 0 1 0 8H4z" fill="#fff"/></svg>
        """

    static let audit = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Audit log</h1>
        <form class="filter" method="get" action="/console/audit" role="search">
        <label for="actor">Actor</label>
        <input id="actor" name="actor" value="{{actor}}" placeholder="a token's name">
        <label for="action">Action</label>
        <select id="action" name="action">
        <option value="">any</option>
        {{#actions}}<option value="{{name}}"{{#selected}} selected{{/selected}}>{{name}}</option>{{/actions}}
        </select>
        <button type="submit">Show</button>
        </form>
        <div class="table-wrap">
        <table>
        <thead><tr><th scope="col">#</th><th scope="col">When</th><th scope="col">Actor</th><th scope="col">Action</th><th scope="col">Detail</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td>{{id}}</td><td class="nowrap">{{at}}</td><td>{{actor}}</td><td class="nowrap">{{action}}</td><td>{{detail}}</td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="5">Nothing recorded.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{#older}}<p><a href="{{older}}">Older entries</a></p>{{/older}}
        {{/content}}
        {{/layout}}
        """

    static let tokens = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Tokens</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        {{#created}}
        <div class="created" role="status">
        <p>The new {{kind}} token “{{name}}”, shown this once: copy it now.</p>
        <p><code class="token">{{token}}</code></p>
        </div>
        {{/created}}
        <div class="table-wrap">
        <table>
        <thead><tr><th scope="col">Name</th><th scope="col">Kind</th><th scope="col">Created</th><th scope="col"></th></tr></thead>
        <tbody>
        {{#rows}}
        <tr>
        <td>{{name}}{{#yours}} <small>(this session's)</small>{{/yours}}</td>
        <td>{{kind}}</td>
        <td class="nowrap">{{createdAt}}</td>
        <td>
        <form class="revoke" method="post" action="/console/tokens/revoke">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <input type="hidden" name="name" value="{{name}}">
        <input type="hidden" name="kind" value="{{kind}}">
        <button type="submit" aria-label="Revoke the {{kind}} token {{name}}">Revoke</button>
        </form>
        </td>
        </tr>
        {{/rows}}
        </tbody>
        </table>
        </div>
        <h2>New token</h2>
        <form class="create" method="post" action="/console/tokens">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="name">Name</label>
        <input id="name" name="name" required maxlength="64" autocomplete="off">
        <label for="kind">Kind</label>
        <select id="kind" name="kind">
        <option value="admin">admin (engineers)</option>
        <option value="enrollment">enrollment (agents)</option>
        </select>
        <button type="submit">Create</button>
        </form>
        <p class="hint">Names are 1 to 64 letters, digits, “-”, “_” or “.”. A revoked admin token's sessions end at once; the last admin token cannot be revoked.</p>
        {{/content}}
        {{/layout}}
        """

    static let pulls = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Pulls</h1>
        <p><a class="button" href="/console/pulls/new">New pull</a></p>
        <div class="table-wrap">
        <table>
        <thead><tr><th scope="col">Pull</th><th scope="col">Asked</th><th scope="col">By</th><th scope="col">For</th><th scope="col">Where it stands</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td><a href="/console/pulls/{{id}}"><code>{{shortID}}</code></a></td><td class="nowrap">{{issuedAt}}</td><td>{{by}}</td><td>{{who}}</td><td>{{status}}</td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="5">No pull yet.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        {{/content}}
        {{/layout}}
        """

    static let newPull = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>New pull</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <form class="pull" method="post" action="/console/pulls">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="uid">User id</label>
        <input id="uid" name="uid" value="{{uid}}" autocomplete="off">
        <label for="agent">Device</label>
        <select id="agent" name="agent">
        <option value="">every device that holds the user</option>
        {{#agents}}<option value="{{id}}"{{#selected}} selected{{/selected}}>{{label}}</option>{{/agents}}
        </select>
        <fieldset>
        <legend>Time</legend>
        {{#ranges}}<label><input type="radio" name="range" value="{{value}}"{{#checked}} checked{{/checked}}> {{label}}</label>{{/ranges}}
        <label for="since">from</label> <input id="since" name="since" type="datetime-local" value="{{since}}">
        <label for="until">to</label> <input id="until" name="until" type="datetime-local" value="{{until}}">
        </fieldset>
        <fieldset>
        <legend>Levels (none: all)</legend>
        {{#levels}}<label><input type="checkbox" name="level-{{name}}"{{#checked}} checked{{/checked}}> {{name}}</label>{{/levels}}
        </fieldset>
        <label for="types">Types</label>
        <input id="types" name="types" value="{{types}}" placeholder="app, network (empty: all)">
        <label for="text">Text</label>
        <input id="text" name="text" value="{{text}}" placeholder="words in the message">
        <label for="reason">Reason</label>
        <input id="reason" name="reason" value="{{reason}}" placeholder="a ticket number (recorded in the audit log)">
        <button type="submit">Pull</button>
        </form>
        <p class="hint">A user id, a device, or both. The pull waits up to an hour for devices that are offline.</p>
        {{/content}}
        {{/layout}}
        """

    static let pull = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Pull <code>{{id}}</code></h1>
        <dl class="facts">
        <dt>For</dt><dd>{{who}}</dd>
        <dt>Filter</dt><dd>{{filter}}</dd>
        <dt>Asked by</dt><dd>{{by}}, {{issuedAt}}</dd>
        <dt>Waits until</dt><dd>{{expiresAt}}</dd>
        {{#removed}}<dt>Removed</dt><dd>{{removed}}</dd>{{/removed}}
        </dl>
        <div class="table-wrap">
        <table{{#open}} data-events="/console/pulls/{{id}}/events"{{/open}}>
        <thead><tr><th scope="col">Device</th><th scope="col">Status</th><th scope="col">Progress</th><th scope="col">Files</th><th scope="col">Detail</th></tr></thead>
        <tbody>
        {{#targets}}
        <tr data-agent="{{agentID}}"><td>{{host}} <code title="{{agentID}}">{{shortID}}</code></td><td><span class="status {{status}}">{{status}}</span></td><td class="progress">{{progress}}</td><td class="files">{{files}}</td><td class="detail">{{detail}}</td></tr>
        {{/targets}}
        {{#waiting}}<tr><td colspan="5">No device holds the user yet: the pull waits for one until it expires.</td></tr>{{/waiting}}
        </tbody>
        </table>
        </div>
        {{#open}}<p class="hint" id="live">Updated as it happens.</p>{{/open}}
        <p><a href="/console/logs?pull={{id}}">Read its logs</a></p>
        {{/content}}
        {{/layout}}
        """

    static let feedback = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Feedback</h1>
        <div class="table-wrap">
        <table>
        <thead><tr><th scope="col">Given</th><th scope="col">User</th><th scope="col">Device</th><th scope="col">What they said</th><th scope="col">Logs</th><th scope="col">Id</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td class="nowrap">{{createdAt}}</td><td>{{uid}}</td><td>{{host}}</td><td class="said">{{text}}</td><td>{{status}}</td><td><a href="/console/logs?feedback={{id}}"><code title="{{id}}">{{shortID}}</code></a></td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="6">No feedback yet.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        <p class="hint">The id opens the feedback's logs; <code>dredge feedback fetch ID</code> downloads them.</p>
        {{/content}}
        {{/layout}}
        """

    static let logs = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Logs</h1>
        <form class="logs" method="get" action="/console/logs" role="search">
        <label>User <input name="uid" value="{{uid}}"></label>
        <label>Pull <input name="pull" value="{{pull}}" size="34"></label>
        <label>Feedback <input name="feedback" value="{{feedback}}" size="34"></label>
        <label>Level <input name="level" value="{{level}}" placeholder="warning+" size="10"></label>
        <label>Type <input name="type" value="{{type}}" placeholder="network" size="10"></label>
        <label>Text <input name="text" value="{{text}}" placeholder="payment declined"></label>
        <label>Where <input name="where" value="{{where}}" placeholder="http.status=503"></label>
        <label>From <input name="since" value="{{since}}" placeholder="YYYY-MM-DD[THH:MM]" size="18"></label>
        <label>To <input name="until" value="{{until}}" placeholder="YYYY-MM-DD[THH:MM]" size="18"></label>
        <button type="submit">Search</button>
        </form>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        {{#hint}}<p class="hint">{{hint}}</p>{{/hint}}
        {{#indexing}}<p class="hint">{{indexing}}</p>{{/indexing}}
        {{#hasRows}}
        <div class="table-wrap">
        <table class="logs">
        <thead><tr><th scope="col">Time (UTC)</th><th scope="col">Host</th><th scope="col">App</th><th scope="col">Level</th><th scope="col">Type</th><th scope="col">User</th><th scope="col">Message</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr class="level-{{level}}"><td class="nowrap">{{time}}</td><td>{{host}}</td><td>{{app}}</td><td class="level">{{level}}</td><td>{{type}}</td><td>{{uid}}</td><td class="message">{{message}}{{#metadata}}<br><small>{{metadata}}</small>{{/metadata}}</td></tr>
        {{/rows}}
        </tbody>
        </table>
        </div>
        <p class="summary">{{count}} records on this page.{{#next}} <a href="{{next}}">Next page</a>{{/next}}</p>
        {{/hasRows}}
        {{#searched}}{{^hasRows}}<p class="summary">No record matches.</p>{{/hasRows}}{{/searched}}
        {{/content}}
        {{/layout}}
        """

    /// The pull page's live progress: its table names its event stream (`data-events`); each
    /// event updates the rows' text (never markup), a target that joined reloads the page.
    static let script = """
        "use strict";
        (function () {
          var table = document.querySelector("table[data-events]");
          if (!table || !window.EventSource) { return; }
          var source = new EventSource(table.getAttribute("data-events"));
          source.onmessage = function (event) {
            var targets = JSON.parse(event.data);
            for (var i = 0; i < targets.length; i++) {
              var t = targets[i];
              if (!/^[0-9a-f]{32}$/.test(t.agentID)) { continue; }
              var row = table.querySelector('tr[data-agent="' + t.agentID + '"]');
              if (!row) { source.close(); window.location.reload(); return; }
              var status = row.querySelector(".status");
              status.textContent = t.status;
              status.className = "status " + t.status;
              row.querySelector(".progress").textContent = t.progress;
              row.querySelector(".files").textContent = t.files;
              row.querySelector(".detail").textContent = t.detail;
            }
          };
          source.onerror = function () {
            if (source.readyState === EventSource.CLOSED) {
              var live = document.getElementById("live");
              if (live) { live.textContent = "Not updated any more: reload the page."; }
            }
          };
          source.addEventListener("done", function () {
            source.close();
            var live = document.getElementById("live");
            if (live) { live.textContent = "Finished."; }
          });
        })();
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
        select { font: inherit; padding: .35rem .6rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
        h2 { font-size: 1.1rem; margin: 1.5rem 0 .6rem; }
        form.create { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; }
        form.revoke { margin: 0; }
        .created { border: 1px solid var(--good); border-radius: 6px; padding: .2rem 1rem; margin-bottom: 1rem; }
        code.token { font-size: 1rem; overflow-wrap: anywhere; }
        form.pull { display: grid; grid-template-columns: 8rem minmax(0, 1fr); max-width: 52rem; gap: .5rem .8rem; align-items: center; }
        form.pull > input, form.pull > select { width: 100%; }
        form.pull fieldset { grid-column: 1 / -1; display: flex; flex-wrap: wrap; gap: .4rem 1rem; border: 1px solid var(--line); border-radius: 4px; }
        form.pull button { grid-column: 2; justify-self: start; }
        a.button { display: inline-block; padding: .35rem .8rem; border: 1px solid var(--accent); border-radius: 4px; text-decoration: none; }
        dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .3rem 1rem; }
        dl.facts dt { color: var(--muted); }
        dl.facts dd { margin: 0; overflow-wrap: anywhere; }
        form.logs { display: flex; flex-wrap: wrap; gap: .4rem .8rem; align-items: center; margin-bottom: .8rem; }
        table.logs td { font-size: .92rem; }
        table.logs td:not(.message) { overflow-wrap: normal; }
        td.message { white-space: pre-wrap; min-width: 20rem; }
        tr.level-error td.level, tr.level-critical td.level { color: var(--bad); font-weight: 600; }
        tr.level-warning td.level { color: #9a6700; font-weight: 600; }
        tr.level-debug td, tr.level-trace td { color: var(--muted); }
        td.said { white-space: pre-wrap; min-width: 16rem; }
        .status.complete { color: var(--good); font-weight: 600; }
        .status.failed, .status.rejected, .status.expired { color: var(--bad); font-weight: 600; }
        @media (max-width: 700px) { form.pull { grid-template-columns: 1fr; } form.pull button { grid-column: 1; } }
        form.filter { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin-bottom: .6rem; }
        .problem { color: var(--bad); font-weight: 600; }
        .hint, .summary, small { color: var(--muted); }
        .table-wrap { overflow-x: auto; }
        table { border-collapse: collapse; width: 100%; }
        th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
        th { white-space: nowrap; }
        td { overflow-wrap: anywhere; }
        td.nowrap, td code { white-space: nowrap; overflow-wrap: normal; }
        .status.online { color: var(--good); font-weight: 600; }
        .status.offline { color: var(--muted); }
        @media (max-width: 700px) { th:nth-child(5), td:nth-child(5), th:nth-child(7), td:nth-child(7) { display: none; } }
        """
}
