/// The console's trigger pages (#54): the list, the form, and a trigger's page.
extension ConsoleTemplates {
    static let triggers = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Triggers</h1>
        {{#mayDefine}}<p><a class="button" href="/console/triggers/new">Define a trigger</a></p>{{/mayDefine}}
        <div class="table-wrap">
        <table class="cards">
        <thead><tr><th scope="col">Trigger</th><th scope="col">Fires on</th><th scope="col">Where</th><th scope="col">Captures</th><th scope="col">By</th><th scope="col">State</th></tr></thead>
        <tbody>
        {{#rows}}
        <tr><td data-label="Trigger"><a href="/console/triggers/{{id}}">{{name}}</a></td><td data-label="Fires on" class="wrap">{{fires}}</td><td data-label="Where" class="wrap">{{scope}}</td><td data-label="Captures" class="wrap">{{captures}}</td><td data-label="By">{{by}}</td><td data-label="State">{{#inForce}}<span class="status running">{{state}}</span>{{/inForce}}{{^inForce}}{{state}}{{/inForce}}</td></tr>
        {{/rows}}
        {{^rows}}<tr><td colspan="6">No trigger yet.</td></tr>{{/rows}}
        </tbody>
        </table>
        </div>
        <p class="hint">A trigger stands on the devices in its scope: when one logs a record it matches, or an app on it crashes, the device sends the records around that moment by itself.</p>
        {{/content}}
        {{/layout}}
        """

    static let newTrigger = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Define a trigger</h1>
        {{#problem}}<p class="problem" role="alert">{{problem}}</p>{{/problem}}
        <form class="pull trigger" method="post" action="/console/triggers">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="name">Name</label>
        <input id="name" name="name" value="{{name}}" maxlength="256" required placeholder="e.g. payment declined">
        <fieldset><legend>Fires on records</legend>
        <label for="level">Levels</label>
        <input id="level" name="level" value="{{level}}" placeholder="e.g. error+ (empty: all)">
        <label for="type">Types</label>
        <input id="type" name="type" value="{{type}}" placeholder="e.g. business, network (empty: all)">
        <label for="text">Contains</label>
        <input id="text" name="text" value="{{text}}" placeholder="e.g. payment declined (message or metadata)">
        <label for="where">Metadata member</label>
        <input id="where" name="where" value="{{where}}" placeholder="e.g. http.status=503">
        </fieldset>
        <label class="check"><input type="checkbox" name="crash"{{#crash}} checked{{/crash}}> Crashes fire it too (an app's run that ended uncleanly); with no record fields, only crashes do</label>
        <fieldset><legend>Where</legend>
        <label for="uid">User id</label>
        <input id="uid" name="uid" value="{{uid}}" autocomplete="off" placeholder="any user">
        <label for="app">App</label>
        <input id="app" name="app" value="{{app}}" placeholder="any app">
        <label for="minVersion">From version</label>
        <input id="minVersion" name="minVersion" value="{{minVersion}}" placeholder="e.g. 2.4">
        <label for="maxVersion">Up to version</label>
        <input id="maxVersion" name="maxVersion" value="{{maxVersion}}" placeholder="e.g. 2.9">
        <label for="labels">Device labels</label>
        <input id="labels" name="labels" value="{{labels}}" placeholder="e.g. region=eu (every device)">
        </fieldset>
        <fieldset><legend>Captures</legend>
        <label for="before">Seconds before a match</label>
        <input id="before" name="before" value="{{before}}" inputmode="numeric" size="5">
        <label for="after">Seconds after</label>
        <input id="after" name="after" value="{{after}}" inputmode="numeric" size="5">
        <label for="perDevice">A day from one device, at most</label>
        <input id="perDevice" name="perDevice" value="{{perDevice}}" inputmode="numeric" size="5">
        <label for="perDay">A day in all, at most</label>
        <input id="perDay" name="perDay" value="{{perDay}}" inputmode="numeric" size="7">
        <label for="days">Stands for (days)</label>
        <input id="days" name="days" value="{{days}}" inputmode="numeric" size="4">
        </fieldset>
        <label for="reason">Reason</label>
        <input id="reason" name="reason" value="{{reason}}" maxlength="256" placeholder="e.g. SUP-1234 (in the audit log)">
        <button type="submit">Define it</button>
        </form>
        <p class="hint">Every device in scope is sent the trigger and matches what it logs against it, off the app's logging path. A capture holds the matching record's user's records (the device's, when the record names no user) from before the match to after it.</p>
        {{/content}}
        {{/layout}}
        """

    static let trigger = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Trigger: {{name}}</h1>
        <dl class="facts">
        <dt>State</dt><dd>{{#inForce}}<span class="status running">{{state}}</span>{{/inForce}}{{^inForce}}{{state}}{{/inForce}}</dd>
        <dt>Fires on</dt><dd>{{fires}}</dd>
        <dt>Where</dt><dd>{{scope}}{{#makerScope}} (within its maker's scope: {{makerScope}}){{/makerScope}}</dd>
        <dt>Captures</dt><dd>{{captures}}</dd>
        <dt>Defined</dt><dd>{{createdAt}} by {{by}}{{#reason}}, reason “{{reason}}”{{/reason}}; until {{expiresAt}}</dd>
        {{#disabled}}<dt>Disabled</dt><dd>{{disabled}}</dd>{{/disabled}}
        {{#removed}}<dt>Removed</dt><dd>{{removed}}</dd>{{/removed}}
        <dt>Id</dt><dd><code>{{id}}</code></dd>
        </dl>
        <h2>What it brought in</h2>
        <p>{{name}}: {{lastDay}} in the last day; {{holders}}.</p>
        {{#hasCaptures}}
        <table>
        <thead><tr><th>Matched</th><th>Device</th><th>User</th><th>Records</th><th>Status</th><th></th></tr></thead>
        <tbody>
        {{#captureRows}}
        <tr><td>{{matchedAt}}{{#crash}} (crash){{/crash}}</td><td>{{host}}</td><td>{{uid}}</td><td>{{records}}</td><td>{{status}}</td><td><a href="/console/captures/{{id}}">{{shortID}}</a></td></tr>
        {{/captureRows}}
        </tbody>
        </table>
        {{/hasCaptures}}
        {{^hasCaptures}}<p class="muted">No capture yet.</p>{{/hasCaptures}}
        {{#mayDisable}}
        <form method="post" action="/console/triggers/{{id}}/disable">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="disable-reason">Reason</label> <input id="disable-reason" name="reason" maxlength="256" placeholder="optional">
        <button type="submit">Disable</button>
        </form>
        {{/mayDisable}}
        {{#mayRemove}}
        <form method="post" action="/console/triggers/{{id}}/remove">
        <input type="hidden" name="csrf" value="{{csrf}}">
        <label for="remove-reason">Reason</label> <input id="remove-reason" name="reason" maxlength="256" placeholder="optional">
        <button type="submit">Remove</button>
        </form>
        {{/mayRemove}}
        {{/content}}
        {{/layout}}
        """

    static let capture = """
        {{% CONTENT_TYPE: DREDGE_HTML}}
        {{<layout}}
        {{$content}}
        <h1>Capture {{shortID}}</h1>
        <dl class="facts">
        <dt>Trigger</dt><dd><a href="/console/triggers/{{triggerID}}">{{triggerName}}</a> (set version {{setVersion}})</dd>
        <dt>Fired</dt><dd>{{matchedAt}}{{#crash}}: the app's run ended uncleanly{{/crash}}</dd>
        <dt>Device</dt><dd>{{host}} <code>{{agentID}}</code></dd>
        <dt>User</dt><dd>{{uid}}</dd>
        <dt>Window</dt><dd>{{since}} to {{until}} (the device's clock)</dd>
        <dt>Status</dt><dd>{{status}}{{#detail}}: {{detail}}{{/detail}}</dd>
        <dt>Records</dt><dd>{{records}}</dd>
        <dt>Received</dt><dd>{{receivedAt}}</dd>
        {{#removed}}<dt>Removed</dt><dd>{{removed}}</dd>{{/removed}}
        <dt>Id</dt><dd><code>{{id}}</code></dd>
        </dl>
        {{#complete}}<p class="links"><a href="/console/logs?capture={{id}}">Read its records</a> <a href="/console/captures/{{id}}/files">Its files</a></p>{{/complete}}
        {{/content}}
        {{/layout}}
        """
}
