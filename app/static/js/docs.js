// The API explorer at /docs: Swagger UI from our own server (app/static/vendor/swagger-ui), started from this
// file rather than an inline script, so the page's strict Content-Security-Policy holds here too.
const root = document.getElementById("swagger-ui");
window.SwaggerUIBundle({
  url: root.dataset.openapi,
  domNode: root,
  deepLinking: true,
  tryItOutEnabled: true,
});
