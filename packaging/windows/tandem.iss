; Inno Setup script: wraps the PyInstaller folder dist\Tandem into TandemSetup-<version>.exe.
; Build the folder first (packaging\README.md, "Windows"), then:  iscc packaging\windows\tandem.iss
; Per-user install (no admin prompt): Start menu entry, optional desktop icon, uninstaller.
; Models, chats and settings live outside the install folder and survive an uninstall.

#define AppName "Tandem"
#define AppVersion "0.1.0"
#define AppExe "tandem-app.exe"

[Setup]
; A fixed id keeps upgrades and the uninstaller tied to one product: never change it.
AppId={{7B0E3C52-4A7D-4C1E-9B8F-2D6A1E5F3C90}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=The Tandem developers
DefaultDirName={localappdata}\Programs\{#AppName}
DefaultGroupName={#AppName}
PrivilegesRequired=lowest
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=TandemSetup-{#AppVersion}
SetupIconFile=tandem.ico
UninstallDisplayIcon={app}\{#AppExe}
; torch's DLLs are large: LZMA2 solid keeps the installer near half the folder's size.
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "Create a desktop icon"; GroupDescription: "Additional icons:"; Flags: unchecked

[Files]
Source: "..\..\dist\Tandem\*"; DestDir: "{app}"; Flags: recursesubdirs createallsubdirs ignoreversion

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\{#AppExe}"
Name: "{group}\Uninstall {#AppName}"; Filename: "{uninstallexe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExe}"; Description: "Start {#AppName}"; Flags: nowait postinstall skipifsilent
