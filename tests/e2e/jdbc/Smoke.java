import java.sql.*;

/** pgjdbc smoke session: connect, DatabaseMetaData (tables, columns, primary keys), a prepared query.
 *  Usage: java -cp postgresql.jar:. Smoke <jdbc url> <source name>; prints one line per check. */
public class Smoke {
    public static void main(String[] args) throws Exception {
        try (Connection conn = DriverManager.getConnection(args[0], "headrace", "")) {
            DatabaseMetaData meta = conn.getMetaData();
            System.out.println("product " + meta.getDatabaseProductName() + " " + meta.getDatabaseProductVersion());
            try (ResultSet tables = meta.getTables(null, "public", args[1], new String[] {"TABLE"})) {
                while (tables.next()) System.out.println("table " + tables.getString("TABLE_NAME") + " " + tables.getString("TABLE_TYPE"));
            }
            try (ResultSet columns = meta.getColumns(null, "public", args[1], null)) {
                while (columns.next()) System.out.println("column " + columns.getString("COLUMN_NAME") + " "
                        + columns.getString("TYPE_NAME") + " " + columns.getInt("NULLABLE"));
            }
            try (ResultSet keys = meta.getPrimaryKeys(null, "public", args[1])) {
                while (keys.next()) System.out.println("pk " + keys.getString("COLUMN_NAME") + " " + keys.getString("PK_NAME"));
            }
            try (PreparedStatement statement = conn.prepareStatement("SELECT ?::int4 + 1 AS answer, current_user")) {
                statement.setInt(1, 41);
                try (ResultSet rows = statement.executeQuery()) {
                    while (rows.next()) System.out.println("answer " + rows.getInt(1) + " " + rows.getString(2));
                }
            }
        }
    }
}
